"""The main job's budget study without training: the multiplier analysis on made-up frontiers
(hand-computed answers), the attention line, the budget plan and the seeds flag."""

import math

import pytest

from eval.experiments.compare import seeds_asked
from eval.experiments.compare_budgets import (
    attention_pattern,
    budget_steps,
    check_budgets,
    multiplier_analysis,
)
from eval.experiments.compare_settings import CompareSettings
from shared.errors import ConfigError
from shared.training.config import TrainConfig

UNIGRAM = 5.2


def run(ar: list[tuple[float, float]], mdm: list[tuple[float, float]]) -> dict:
    def points(frontier):
        return [{"flops": c, "loss": loss, "steps": 0} for c, loss in frontier]

    return {"points": {"ar": points(ar), "mdm": points(mdm)}}


# Seed 0: AR at 1e10..8e10, MDM 10x the compute for the same losses (exactly parallel), plus one
# MDM point on the plateau that must not count. Seed 1: the MDM needs 20x.
AR = [(1e10, 4.0), (2e10, 3.6), (4e10, 3.3), (8e10, 3.1)]
SEED0 = run(AR, [(5e10, 5.15), (1e11, 4.0), (2e11, 3.6), (4e11, 3.3), (8e11, 3.1)])
SEED1 = run(AR, [(2e11, 4.0), (4e11, 3.6), (8e11, 3.3), (1.6e12, 3.1)])


def test_the_analysis_reads_the_headline_at_the_rule_and_intervals_over_seeds():
    settings = CompareSettings(seeds=(0, 1), headline_rule="mdm_largest", plateau_margin=0.1)
    analysis = multiplier_analysis({0: SEED0, 1: SEED1}, UNIGRAM, settings)
    assert analysis["seeds"][0]["past_plateau"] == {"ar": 4, "mdm": 4}  # the 5.15 point is out
    assert analysis["seeds"][0]["headline_loss"] == 3.1
    assert analysis["seeds"][0]["multiplier"] == pytest.approx(10.0)
    assert analysis["seeds"][1]["multiplier"] == pytest.approx(20.0)
    headline = analysis["multiplier"]
    assert headline["mean"] == pytest.approx(math.sqrt(200))  # geometric mean
    half = 12.706204736174707 * math.log(2) / 2  # t(0.975, 1) * sd(log M) / sqrt(2)
    assert headline["low"] == pytest.approx(math.sqrt(200) * math.exp(-half))
    # Parallel frontiers: both seeds' M(L) is flat, and the exponents agree within each seed.
    assert all(m == pytest.approx(10.0) for _, m in analysis["seeds"][0]["curve"])
    # The MDM's points are the AR's at 10x (20x) the compute, so its log-log fit is the AR's
    # shifted: M from the fits is 10x (20x) at any loss.
    assert analysis["seeds"][0]["fitted_multiplier"] == pytest.approx(10.0, rel=1e-9)
    assert analysis["fitted_multiplier"]["values"][1] == pytest.approx(20.0, rel=1e-9)
    difference = analysis["exponent_difference"]
    assert difference["values"] == pytest.approx((0.0, 0.0), abs=1e-12)
    assert analysis["final_gap"]["values"] == pytest.approx((0.0, 0.0), abs=1e-12)


def test_a_seed_whose_frontiers_do_not_meet_is_reported_unmeasured():
    stuck = run(AR, [(1e11, 5.15), (2e11, 5.14), (4e11, 5.12), (8e11, 5.0)])
    settings = CompareSettings(seeds=(0, 1))
    analysis = multiplier_analysis({0: SEED0, 1: stuck}, UNIGRAM, settings)
    assert analysis["unmeasured_seeds"] == [1]
    assert analysis["multiplier"]["values"] == pytest.approx((10.0,))
    assert analysis["multiplier"]["low"] is None  # one measured seed: no interval


def test_ar_smallest_rule():
    settings = CompareSettings(headline_rule="ar_smallest")
    analysis = multiplier_analysis({0: SEED1}, UNIGRAM, settings)
    assert analysis["seeds"][0]["headline_loss"] == 4.0
    assert analysis["seeds"][0]["multiplier"] == pytest.approx(20.0)


def test_attention_pattern_in_words():
    assert attention_pattern("ar", 0) == "causal, full"
    assert attention_pattern("mdm", 0) == "bidirectional, full"
    assert attention_pattern("ar", 8) == (
        "causal, window 8 (each position sees itself and the 7 before)"
    )
    assert attention_pattern("mdm", 8) == (
        "bidirectional, window 8 (each position sees the 7 on each side)"
    )


def test_budget_plan_and_its_checks():
    assert budget_steps(800, (1 / 8, 1 / 4, 1 / 2)) == [100, 200, 400, 800]
    assert budget_steps(150, (1 / 4, 1 / 2)) == [38, 75, 150]
    cfg = TrainConfig(warmup_steps=10, cooldown_fraction=0.2)
    check_budgets({"ar": [38, 75, 150]}, cfg)
    with pytest.raises(ConfigError, match=r"AR budget\(s\) \[5, 10\] steps .* inside the 10-step"):
        check_budgets({"ar": [5, 10, 20]}, cfg)


def test_seeds_flag():
    assert seeds_asked(None, None) is None
    assert seeds_asked("0,1,2", None) == (0, 1, 2)
    assert seeds_asked(None, 5) == (5,)
    with pytest.raises(ConfigError, match="not both"):
        seeds_asked("0,1", 5)
    with pytest.raises(ConfigError, match="distinct integers >= 0"):
        seeds_asked("1,1", None)
    with pytest.raises(ConfigError, match="integers separated by commas"):
        seeds_asked("0;1", None)
