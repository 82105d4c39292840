"""Learning-curve arithmetic against hand-computed answers."""

import json
import math

import numpy as np
import pytest

from eval.curves import (
    check_increasing,
    compute_multipliers,
    fit_power_law,
    flops_to_reach,
    geometric_budgets,
    headline_multiplier,
    select_learning_rate,
    unigram_entropy,
)
from eval.experiments.compare_curves import best_and_final, read_curve, sampling_checkpoint
from shared.errors import ConfigError
from shared.training import cli
from shared.training.schedule import curve_steps


def power_law(a: float, alpha: float, shift: float = 1.0):
    """L(C) = a (C / shift)^-alpha: the same curve needing ``shift`` times the compute."""
    return lambda c: a * (c / shift) ** -alpha


BUDGETS = geometric_budgets(1e12, 1e15, 10)


def test_budgets_are_geometric_and_checked():
    assert BUDGETS[0] == pytest.approx(1e12) and BUDGETS[-1] == pytest.approx(1e15)
    ratios = np.diff(np.log(BUDGETS))
    assert np.allclose(ratios, ratios[0])
    for bad in ([1e12, 1e12], [2e12, 1e12], [0, 1], [5e12]):
        with pytest.raises(ConfigError, match="budget"):
            check_increasing(bad)
    with pytest.raises(ConfigError):
        geometric_budgets(1e12, 1e15, 1)


def test_two_power_laws_shifted_by_4x_give_a_multiplier_of_4():
    ar_loss, mdm_loss = power_law(40.0, 0.1), power_law(40.0, 0.1, shift=4.0)
    ar = [(c, ar_loss(c)) for c in BUDGETS]
    mdm = [(c, mdm_loss(c)) for c in BUDGETS]
    multipliers = compute_multipliers(ar, mdm)
    reached = [m for m in multipliers if m.value is not None]
    assert all(m.value == pytest.approx(4.0, rel=1e-9) for m in reached)
    # beyond the MDM's last point (1e15) the AR losses are not reached: 1e15 / 4 < C
    assert [m.value is None for m in multipliers] == [4 * c > 1e15 * (1 + 1e-9) for c in BUDGETS]
    headline = headline_multiplier(ar, mdm)
    assert headline.value == pytest.approx(4.0) and headline.ar_flops <= 1e15 / 4


def test_interpolation_between_points_and_not_reached_beyond_the_curve():
    curve = [(1.0, 8.0), (100.0, 2.0)]
    # log-log straight line: loss 4 is halfway in log loss, so halfway in log compute
    assert flops_to_reach(curve, 4.0) == pytest.approx(10.0)
    assert flops_to_reach(curve, 9.0) == 1.0  # already there at the first point
    assert flops_to_reach(curve, 1.9) is None
    assert flops_to_reach([], 3.0) is None


def test_the_headline_interval_comes_from_the_mdm_band():
    ar = [(1.0, 4.0), (10.0, 3.0)]
    mdm = [(1.0, 6.0), (10.0, 4.0), (100.0, 3.0)]
    low = [(c, 0.9 * v) for c, v in mdm]
    high = [(c, 1.1 * v) for c, v in mdm]
    headline = headline_multiplier(ar, mdm, low, high)
    assert headline.value == pytest.approx(10.0)
    assert (
        headline.low < headline.value and headline.high is None
    )  # the upper band never gets there
    assert headline_multiplier(ar, [(1.0, 9.0), (10.0, 8.0)]) is None


def test_power_law_fit_recovers_known_parameters():
    curve = [(c, 1.7 + 3.0 * (c / 1e12) ** -0.35) for c in BUDGETS]
    fit = fit_power_law(curve)
    assert fit.E == pytest.approx(1.7, abs=1e-3) and fit.alpha == pytest.approx(0.35, abs=1e-3)
    assert fit(3e13) == pytest.approx(1.7 + 3.0 * 30**-0.35, rel=1e-4)
    assert fit_power_law(curve[:3]) is None


def test_unigram_entropy_by_hand():
    # loss positions (not BOS, not padding 9): tokens 1, 1, 2, 3 -> p = 1/2, 1/4, 1/4
    rows = np.array([[0, 1, 1, 9], [0, 2, 3, 9]])
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert unigram_entropy(rows, pad_id=9) == pytest.approx(expected)
    with pytest.raises(ConfigError):
        unigram_entropy(np.array([[0, 9, 9]]), pad_id=9)


def test_learning_rate_selection_picks_the_lowest_finite_loss_and_records_the_table():
    choice = select_learning_rate({1e-3: 3.2, 3e-3: 3.0, 1e-2: float("nan"), 3e-2: float("inf")})
    assert choice.chosen == 3e-3
    assert [row["lr"] for row in choice.table] == [1e-3, 3e-3, 1e-2, 3e-2]
    assert [row["diverged"] for row in choice.table] == [False, False, True, True]
    with pytest.raises(ConfigError, match="every learning rate of the sweep diverged"):
        select_learning_rate({1e-2: float("nan"), 1e-1: float("inf")})


def test_training_measures_a_learning_curve_on_the_flop_axis(tmp_path):
    curves = {}
    for objective in ("ar", "mdm"):
        out = tmp_path / objective
        argv = ["--preset", "tiny", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
        argv += ["--objective", objective, "--max-steps", "32", "--eval-every", "1000"]
        cli.train_from_argv([*argv, "--curve-points", "5"])
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        points = [r for r in records if r["kind"] == "eval" and r.get("on_curve")]
        assert [r["step"] for r in points] == curve_steps(32, 5) == [1, 2, 6, 13, 32]
        assert all(b["flops"] > a["flops"] for a, b in zip(points, points[1:]))
        curves[objective] = [(r["flops"], r["val_nats_per_token"]) for r in points]
    # the same steps, so the same FLOP axis up to the MDM's one extra [MASK] row
    for (c_ar, _), (c_mdm, _) in zip(curves["ar"], curves["mdm"]):
        assert c_mdm == pytest.approx(c_ar, rel=0.02)
    assert len(compute_multipliers(curves["ar"], curves["mdm"])) == 5


def test_an_overfitting_run_samples_from_its_best_checkpoint(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000020").mkdir(parents=True)
    (run / "checkpoints" / "step_000040").mkdir()
    (run / "checkpoints" / "best.json").write_text('{"step": 20, "val_nats_per_token": 3.0}')

    def write_curve(final: float) -> None:
        records = [(10, 3.5), (20, 3.0), (40, final)]
        lines = [
            json.dumps({"kind": "eval", "on_curve": True, "step": s, "flops": s * 1e9,
                        "val_nats_per_token": v, "val_nats_per_token_se": 0.01})
            for s, v in records
        ]  # fmt: skip
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")

    write_curve(3.1)  # 3.3% above the best: overfits
    path, label = sampling_checkpoint(run)
    assert path == run / "checkpoints" / "step_000020" and "best checkpoint (step 20" in label
    assert best_and_final(read_curve(run))["overfits"]
    write_curve(3.02)  # within 1%: the final checkpoint
    assert sampling_checkpoint(run) == (run, "final checkpoint")
