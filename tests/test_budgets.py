"""The compute multiplier from budget points (eval.budgets) against hand-computed answers."""

import math

import pytest

from eval.budgets import (
    fit_log_log,
    flops_at,
    headline_loss,
    multiplier_at,
    multiplier_curve,
    past_plateau,
    seed_spread,
    shared_losses,
)
from shared.errors import ConfigError

AR = [(1e10, 4.0), (2e10, 3.0), (4e10, 2.5)]
MDM = [(1e11, 4.0), (4e11, 3.0), (8e11, 2.8)]


def test_flops_at_interpolates_in_log_log_and_never_extrapolates():
    assert flops_at(AR, 4.0) == pytest.approx(1e10)
    assert flops_at(AR, 3.0) == pytest.approx(2e10)
    f = math.log(3.5 / 4) / math.log(3 / 4)  # the fraction of the way from 4.0 to 3.0 in log
    assert flops_at(AR, 3.5) == pytest.approx(1e10 * 2**f)
    assert flops_at(AR, 4.1) is None and flops_at(AR, 2.4) is None
    assert flops_at([], 3.0) is None


def test_multiplier_at_a_loss():
    assert multiplier_at(AR, MDM, 4.0) == pytest.approx(10.0)
    assert multiplier_at(AR, MDM, 3.0) == pytest.approx(20.0)
    # Between the first two points of each: 1e11 * 4^f / (1e10 * 2^f) = 10 * 2^f.
    f = math.log(3.5 / 4) / math.log(3 / 4)
    assert multiplier_at(AR, MDM, 3.5) == pytest.approx(10 * 2**f)
    f_mdm, f_ar = math.log(2.9 / 3) / math.log(2.8 / 3), math.log(2.9 / 3) / math.log(2.5 / 3)
    assert multiplier_at(AR, MDM, 2.9) == pytest.approx(4e11 * 2**f_mdm / (2e10 * 2**f_ar))
    assert multiplier_at(AR, MDM, 2.6) is None  # the MDM never gets there
    assert multiplier_at(AR, MDM, 4.5) is None  # neither curve starts that high


def test_the_shared_range_and_the_curve_over_it():
    assert shared_losses(AR, MDM) == (2.8, 4.0)
    assert shared_losses(AR, [(1e11, 5.0), (2e11, 4.5)]) is None
    curve = multiplier_curve(AR, MDM, count=5)
    assert [loss for loss, _ in curve] == pytest.approx(
        [2.8 * (4.0 / 2.8) ** (k / 4) for k in range(5)]
    )
    assert curve[-1][1] == pytest.approx(10.0)
    assert all(m == pytest.approx(multiplier_at(AR, MDM, loss)) for loss, m in curve)


def test_headline_rules_and_the_plateau_filter():
    assert headline_loss("mdm_largest", AR, MDM) == 2.8
    assert headline_loss("ar_smallest", AR, MDM) == 4.0
    with pytest.raises(ConfigError, match="headline rule 'best' is not one of"):
        headline_loss("best", AR, MDM)
    points = [(1.0, 5.19), (2.0, 5.12), (3.0, 4.2)]
    assert past_plateau(points, unigram=5.2, margin=0.1) == [(3.0, 4.2)]


def test_log_log_fit_recovers_an_exact_power_law():
    points = [(c, 100 * c**-0.1) for c in (1e10, 3e10, 1e11, 3e11)]
    fit = fit_log_log(points)
    assert fit.alpha == pytest.approx(0.1)
    assert fit.log_a == pytest.approx(math.log(100))
    assert fit.rms < 1e-12
    assert fit.flops_at(100 * 1e11**-0.1) == pytest.approx(1e11)
    assert fit_log_log(points[:3]) is None  # fewer than four points
    assert fit_log_log([(1, 1.0), (2, 1.1), (3, 1.2), (4, 1.3)]) is None  # rising


def test_seed_spread_is_a_t_interval():
    arithmetic = seed_spread([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * sd 1 / sqrt(3)
    assert (arithmetic.mean, arithmetic.low, arithmetic.high) == pytest.approx(
        (2.0, 2.0 - half, 2.0 + half)
    )
    geometric = seed_spread([10.0, 20.0], geometric=True)
    half = 12.706204736174707 * (math.log(2) / math.sqrt(2)) / math.sqrt(2)
    centre = math.log(math.sqrt(200))
    assert geometric.mean == pytest.approx(math.sqrt(200))
    assert (geometric.low, geometric.high) == pytest.approx(
        (math.exp(centre - half), math.exp(centre + half))
    )
    one = seed_spread([7.0])
    assert one.low is None and "one seed" in one.text()
    assert seed_spread([]) is None
