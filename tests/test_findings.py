"""The findings (``python -m eval.findings``): every verdict rule on constructed inputs (each
verdict reachable, each rule's exceptions), and the smoke scale of every finding end to end."""

import json
import math

import pytest

from eval.findings import adaptation, compute_gap, data_constrained, pathstar, reversal
from eval.findings import sample_quality as quality
from eval.findings.__main__ import main
from eval.findings.registry import FINDINGS
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    all_seeds_agree,
    direction_verdict,
    magnitude_verdict,
    seed_interval,
    t_interval,
    wilson_interval,
)

# ---- the rules -----------------------------------------------------------------------------------


def test_wilson_interval_matches_hand_computed_values():
    # 5/10: centre 0.5, half-width z*sqrt(0.025 + z^2/400)/(1 + z^2/10)
    interval = wilson_interval(5, 10)
    assert interval.low == pytest.approx(0.2366, abs=1e-4)
    assert interval.high == pytest.approx(0.7634, abs=1e-4)
    zero = wilson_interval(0, 10)
    assert zero.low == 0.0 and zero.high == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10).high == 1.0
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)


def test_seed_interval_adds_within_and_between_seed_variance():
    # values 1 and 3: between-seed variance 2; stderrs 0.5 each: within 0.25 -> var of mean 1.125
    interval = seed_interval([1.0, 3.0], [0.5, 0.5])
    assert interval.value == 2.0
    assert interval.high - 2.0 == pytest.approx(1.959964 * math.sqrt(2.25 / 2))
    assert seed_interval([4.0]).low == 4.0  # one seed, no stderr: a point
    t = t_interval([1.0, 2.0, 3.0])
    assert t.high - 2.0 == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)


def test_direction_rule_reaches_every_verdict():
    low, high, overlapping = Interval(1, 0.5, 1.5), Interval(3, 2, 4), Interval(1.8, 1.2, 2.5)
    assert direction_verdict(low, high) == REPRODUCED
    assert direction_verdict(high, low) == NOT_REPRODUCED
    assert direction_verdict(low, overlapping) == INCONCLUSIVE
    assert direction_verdict(None, high) == INCONCLUSIVE


def test_magnitude_rule_reaches_every_verdict():
    assert magnitude_verdict(16, Interval(12, 9, 20)) == REPRODUCED
    assert magnitude_verdict(16, Interval(11.6, 10.5, 13.0)) == NOT_REPRODUCED
    assert magnitude_verdict(16, Interval(30, 20, math.inf)) == NOT_REPRODUCED
    assert magnitude_verdict(16, Interval(12, 12, math.inf)) == REPRODUCED
    assert magnitude_verdict(16, None) == INCONCLUSIVE
    assert magnitude_verdict(16, Interval(8, -math.inf, 9)) == NOT_REPRODUCED
    assert magnitude_verdict(-1e9, Interval(8, -math.inf, 9)) == REPRODUCED


def test_intervals_must_contain_their_value_and_seeds_must_pair():
    with pytest.raises(ValueError, match="contain"):
        Interval(5, 0, 1)
    assert all_seeds_agree([1, 2], [2, 3]) and not all_seeds_agree([1, 4], [2, 3])
    with pytest.raises(ValueError, match="equal"):
        all_seeds_agree([1], [1, 2])


# ---- each finding's rule on constructed measurements ---------------------------------------------


def facts_seed(ar_reverse: float, mdm_reverse: float) -> dict:
    return {
        "ar": {
            "forward_accuracy": 1.0,
            "reverse_prompted_accuracy": ar_reverse,
            "reverse_scored_accuracy": 1.0,
        },
        "mdm": {"forward_accuracy": 1.0, "reverse_accuracy": mdm_reverse},
    }


@pytest.mark.parametrize(
    "seeds, verdict",
    [
        ([(0.0, 1.0), (1 / 26, 1.0)], REPRODUCED),
        ([(1.0, 0.0), (1.0, 1 / 26)], NOT_REPRODUCED),
        ([(0.5, 0.6), (0.5, 0.55)], INCONCLUSIVE),
        # pooled intervals separate, but one seed goes the other way
        ([(0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.3, 0.2)], INCONCLUSIVE),
    ],
)
def test_reversal_verdicts(tmp_path, seeds, verdict):
    settings = reversal.ReversalSettings(tuple(range(len(seeds))), 26, 100, "tiny")
    per_seed = [facts_seed(a, m) for a, m in seeds]
    result = reversal.judge("smoke", settings, per_seed, tmp_path)
    assert result.verdict == verdict
    text = (tmp_path / "report.md").read_text()
    assert text.index("Rule (direction)") < text.index("Accuracy over the facts")


def curve(losses: list[float], se: float = 0.01, rows: int = 32, batch: int = 16) -> list[dict]:
    """Periodic validations every 2 steps (one epoch = rows / batch steps)."""
    return [
        {
            "step": 2 * (i + 1),
            "epoch": 2 * (i + 1) * batch / rows,
            "flops": 1e9 * (i + 1),
            "val_nats_per_token": loss,
            "val_nats_per_token_se": se,
        }
        for i, loss in enumerate(losses)
    ]


AR_OVERFITS = [5.0, 4.0, 3.5, 3.6, 3.9, 4.3, 4.8, 5.2]


@pytest.mark.parametrize(
    "mdm, verdict",
    [
        ([5.5, 4.8, 4.0, 3.5, 3.3, 3.2, 3.1, 3.05], REPRODUCED),
        # above the AR and still falling at the end: the budget is short of the claim's regime
        ([5.8, 5.6, 5.4, 5.2, 5.0, 4.8, 4.6, 4.4], INCONCLUSIVE),
        # above the AR and bottomed out early: refuted at this scale
        ([5.8, 5.0, 4.4, 4.5, 4.6, 4.7, 4.8, 4.9], NOT_REPRODUCED),
    ],
)
def test_data_constrained_verdicts(tmp_path, mdm, verdict):
    settings = data_constrained.DataSettings((0, 1), "smoke", 1000, 8, 1)
    curves = {
        "ar": [curve(AR_OVERFITS), curve([x + 0.01 for x in AR_OVERFITS])],
        "mdm": [curve(mdm), curve([x + 0.01 for x in mdm])],
    }
    result = data_constrained.judge("smoke", settings, curves, tmp_path)
    assert result.verdict == verdict
    assert (tmp_path / "data_constrained_curves.png").exists()
    assert result.numbers["peak_verdict"] in (REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED)


def test_data_constrained_crossing_is_where_the_mdm_passes_the_ar_best():
    ar = [{"loss": v, "epoch": i, "flops": i} for i, v in enumerate([5, 4, 3.5, 4])]
    mdm = [{"loss": v, "epoch": i, "flops": i} for i, v in enumerate([6, 4.5, 3.6, 3.4])]
    assert data_constrained.crossing(ar, mdm)["epoch"] == 3
    assert data_constrained.crossing(ar, mdm[:3]) is None
    assert data_constrained.curves_cross(ar, mdm)["epoch"] == 3
    overfit = [{"loss": v, "epoch": i, "flops": i} for i, v in enumerate([5, 4, 4.5, 5])]
    assert data_constrained.curves_cross(overfit, mdm)["epoch"] == 2  # below the AR, not its best
    with pytest.raises(ValueError, match="different steps"):
        data_constrained.mean_curve([curve([1, 2]), curve([1, 2, 3])])


def gap_size(interval: Interval | None) -> dict:
    points = [
        {"flops": 1e9 * (i + 1), "loss": 5.0 - i, "steps": 10 * (i + 1), "epochs": 0.1}
        for i in range(2)
    ]
    return {
        "size": {"dim": 64},
        "parameters": 1000,
        "unigram": 5.2,
        "past_plateau": {0: {"ar": 2, "mdm": 1}},
        "interval": None if interval is None else interval.as_dict(),
        "points": {0: {"points": {"ar": points, "mdm": points}}},
    }


@pytest.mark.parametrize(
    "interval, verdict",
    [
        (Interval(15, 12, 19), REPRODUCED),
        (Interval(11.6, 10.5, 13.0), NOT_REPRODUCED),
        (Interval(12, 10, math.inf), REPRODUCED),
        (None, INCONCLUSIVE),
    ],
)
def test_compute_gap_verdict_is_the_magnitude_at_the_largest_size(tmp_path, interval, verdict):
    settings = compute_gap.SETTINGS["smoke"]
    measured = [gap_size(Interval(3, 2, 4)), gap_size(interval)]
    result = compute_gap.judge("smoke", settings, measured, tmp_path)
    assert result.verdict == verdict
    # the smaller size's direction (AR ahead: interval above 1) is judged and reported too
    assert result.numbers["direction_verdicts"][0] == REPRODUCED


def judged_set(
    model: str, log_ppl: float, half: float, entropy: float, steps: int = 16, divisor: int = 1
) -> dict:
    return {
        "model": model,
        "steps": steps,
        "divisor": divisor,
        "log_ppl": Interval(log_ppl, log_ppl - half, log_ppl + half).as_dict(),
        "unigram_entropy": entropy,
        "repetition_rate_4gram": 0.0,
    }


def test_sample_quality_ordering_needs_comparable_entropy():
    ar, bd = judged_set("AR", 5, 0.1, 4.0), judged_set("BD", 6, 0.1, 4.0)
    mdm = judged_set("MDM", 7, 0.1, 4.0)
    assert quality.ordered(ar, bd) == REPRODUCED and quality.ordered(bd, mdm) == REPRODUCED
    assert quality.ordered(mdm, ar) == NOT_REPRODUCED
    repetitive = judged_set("AR", 5, 0.1, 3.0)  # lower perplexity bought with 25% less entropy
    assert quality.ordered(repetitive, bd) == INCONCLUSIVE
    assert quality.combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert quality.combine([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert quality.combine([INCONCLUSIVE, NOT_REPRODUCED]) == NOT_REPRODUCED
    interval = quality.log_ppl_interval([1.0, 2.0, 3.0, float("nan")])
    assert interval.value == 2.0 and interval.high - 2.0 == pytest.approx(1.959964 / math.sqrt(3))


def test_sample_quality_judge_writes_the_verdict(tmp_path):
    settings = quality.QualitySettings("smoke", 4, 4, 16, (1, 4))
    sets = {
        "AR": judged_set("AR", 5, 0.1, 4.0),
        "BD-4 16 steps": judged_set("BD-4", 6, 0.1, 4.0),
        "BD-4 4 steps": judged_set("BD-4", 6.5, 0.1, 4.0, steps=4, divisor=4),
        "MDM 16 steps": judged_set("MDM", 7, 0.1, 4.0),
        "MDM 4 steps": judged_set("MDM", 7.05, 0.1, 4.0, steps=4, divisor=4),
    }
    result = quality.judge("smoke", settings, {"judge": "test", "sets": sets}, tmp_path)
    assert result.verdict == REPRODUCED
    assert result.numbers["steps"] == {"BD-4": REPRODUCED, "MDM": INCONCLUSIVE}


def star_result(degree: int, ar_exact: float, mdm_exact: float, n: int = 200) -> dict:
    def probe(exact):
        return {"exact_match": exact, "first_step": exact, "node_accuracy": exact, "n": n}

    return {"degree": degree, "ar": probe(ar_exact), "mdm": probe(mdm_exact)}


@pytest.mark.parametrize(
    "settings, verdict",
    [
        ({"d2-l3": (0.5, 0.95), "d3-l3": (0.33, 0.9)}, REPRODUCED),
        ({"d2-l3": (0.5, 0.95), "d3-l3": (0.33, 0.35)}, INCONCLUSIVE),
        ({"d2-l3": (0.5, 0.95), "d3-l3": (0.6, 0.3)}, NOT_REPRODUCED),
    ],
)
def test_pathstar_needs_every_graph_setting(tmp_path, settings, verdict):
    measured = {
        label: [star_result(int(label[1]), ar, mdm)] for label, (ar, mdm) in settings.items()
    }
    result = pathstar.judge("smoke", pathstar.SETTINGS["smoke"], measured, tmp_path)
    assert result.verdict == verdict


def adaptation_curves(adapted: list[float], scratch: list[float]) -> dict:
    return {
        "ar": curve([5, 4, 3]),
        "mdm-scratch": curve(scratch),
        "mdm-adapted": curve(adapted),
    }


def test_adaptation_verdict_and_compute_saving(tmp_path):
    curves = adaptation_curves([5.0, 4.5, 4.0, 3.8], [6.0, 5.5, 5.0, 4.5])
    summaries = {
        name: {"step": 8, "init_from": {"total_flops": 3e9}}
        for name in ("ar", "mdm-scratch", "mdm-adapted")
    }
    result = adaptation.judge("smoke", adaptation.SETTINGS["smoke"], summaries, curves, tmp_path)
    assert result.verdict == REPRODUCED
    saving = result.numbers["saving"]
    # the adapted curve reaches the scratch run's final 4.5 exactly at its second point (2e9)
    assert saving["needed_flops"] == pytest.approx(2e9)
    assert saving["saving"] == pytest.approx(2.0)
    assert saving["saving_with_ar"] == pytest.approx(4e9 / 5e9)
    worse = adaptation_curves([6.5, 6.0, 5.5, 5.2], [6.0, 5.5, 5.0, 4.5])
    result = adaptation.judge("smoke", adaptation.SETTINGS["smoke"], summaries, worse, tmp_path)
    assert result.verdict == NOT_REPRODUCED and result.numbers["saving"]["saving"] is None


# ---- end to end ----------------------------------------------------------------------------------


def test_every_finding_runs_at_smoke_scale_and_writes_its_index(tmp_path):
    """The plumbing of every finding (the verdicts at this scale mean nothing)."""
    out = tmp_path / "findings"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["--scale", "smoke", "--out", str(out), *cache]) == 0
    index = json.loads((out / "index.json").read_text())
    assert [row["name"] for row in index["findings"]] == list(FINDINGS)
    for row in index["findings"]:
        assert row["verdict"] in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
        report = (out / row["name"] / "report.md").read_text()
        assert "**Rule" in report and "## Verdict" in report
        seeds = json.loads((out / row["name"] / "report.json").read_text())["provenance"]["seeds"]
        expected = getattr(FINDINGS[row["name"]].settings["smoke"], "seeds", (0,))
        assert seeds == {"train": list(expected)}
    markdown = (out / "index.md").read_text()
    assert markdown.count("[report](") == len(FINDINGS)
    # a rerun reuses every trained run and measured stage
    assert main(["--scale", "smoke", "--out", str(out), "--only", "reversal", *cache]) == 0


def test_unknown_finding_is_one_clear_error(tmp_path, capsys):
    assert main(["--scale", "smoke", "--out", str(tmp_path), "--only", "nope"]) == 2
    assert "unknown finding(s) ['nope']" in capsys.readouterr().err
