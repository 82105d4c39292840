"""The findings (``python -m eval.findings``): every verdict rule on constructed inputs (each
verdict reachable, each rule's exceptions), and the smoke scale of every finding end to end."""

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from eval.findings import (
    adaptation,
    compute_gap,
    data_constrained,
    pathstar,
    reuse_half_life,
    reversal,
)
from eval.findings import sample_quality as quality
from eval.findings.__main__ import checked_labels, main
from eval.findings.registry import FINDINGS
from eval.findings.table import findings_table
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TRAINED,
    REPRODUCED,
    Band,
    Interval,
    LearnedCheck,
    accuracy_interval,
    all_seeds_agree,
    combine,
    direction_verdict,
    learned_gate,
    magnitude_verdict,
    one_seed_guard,
    paired_difference,
    seed_interval,
    t_interval,
    wilson_interval,
)
from eval.provenance import git_output
from eval.quality import JudgeScore
from eval.sample_sets import before_eos

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


def test_seed_intervals_use_the_t_distribution_and_one_seed_is_unbounded():
    # values 1 and 3: sd sqrt(2), t(0.975, 1 dof) = 12.7062 -> half-width 12.7062 * sqrt(2 / 2)
    interval = seed_interval([1.0, 3.0])
    assert interval.value == 2.0
    assert interval.high - 2.0 == pytest.approx(12.706205, rel=1e-6)
    one = seed_interval([4.0])  # one training run says nothing about training randomness
    assert one.value == 4.0 and one.low == -math.inf and one.high == math.inf
    t = t_interval([1.0, 2.0, 3.0])
    assert t.high - 2.0 == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)
    # paired: a shared per-seed offset cancels (differences 1, 1.2, 0.8: sd 0.2)
    paired = paired_difference([5.0, 7.2, 3.8], [4.0, 6.0, 3.0])
    assert paired.value == pytest.approx(1.0)
    assert paired.high - 1.0 == pytest.approx(4.302653 * 0.2 / math.sqrt(3), rel=1e-5)
    with pytest.raises(ValueError, match="equal"):
        paired_difference([1.0], [1.0, 2.0])


def test_accuracy_interval_covers_seeds_and_examples():
    # seeds agree perfectly: the Wilson interval of 60/60 trials remains
    agree = accuracy_interval([1.0, 1.0, 1.0], [20, 20, 20])
    assert agree.value == 1.0 and agree.low == pytest.approx(wilson_interval(60, 60).low)
    # seeds disagree: the t interval over seeds (clipped to [0, 1]) is wider than Wilson's
    spread = accuracy_interval([0.1, 0.9, 0.5], [100, 100, 100])
    assert spread.value == pytest.approx(0.5)
    assert spread.low == 0.0 and spread.high == 1.0
    # one seed: its t interval is unbounded, so the union is all of [0, 1] (not Wilson's alone)
    assert accuracy_interval([0.5], [10]) == Interval(0.5, 0.0, 1.0)


def test_direction_rule_reaches_every_verdict():
    low, high, overlapping = Interval(1, 0.5, 1.5), Interval(3, 2, 4), Interval(1.8, 1.2, 2.5)
    assert direction_verdict(low, high) == REPRODUCED
    assert direction_verdict(high, low) == NOT_REPRODUCED
    assert direction_verdict(low, overlapping) == INCONCLUSIVE
    assert direction_verdict(None, high) == INCONCLUSIVE


def test_a_half_open_interval_never_wins_a_direction():
    bounded = Interval(3, 2, 4)
    assert direction_verdict(Interval(1, -math.inf, 1.5), bounded) == INCONCLUSIVE
    assert direction_verdict(Interval(1, 0.5, 1.5), Interval(3, 2, math.inf)) == INCONCLUSIVE
    assert direction_verdict(Interval(6, 5, math.inf), bounded) == INCONCLUSIVE
    assert direction_verdict(bounded, Interval(1, -math.inf, 1.5)) == INCONCLUSIVE
    # the same intervals with both ends finite do separate
    assert direction_verdict(Interval(1, 0, 1.5), bounded) == REPRODUCED
    assert direction_verdict(Interval(6, 5, 7), bounded) == NOT_REPRODUCED


def test_combine_of_no_parts_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        combine([])
    assert combine([REPRODUCED]) == REPRODUCED


def test_one_seed_never_reproduces():
    for verdict in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE):
        guarded, notes = one_seed_guard(verdict, 1)
        assert guarded == INCONCLUSIVE and "One training seed" in notes[0]
    assert one_seed_guard(NOT_TRAINED, 1)[0] == NOT_TRAINED
    assert one_seed_guard(REPRODUCED, 2) == (REPRODUCED, [])


def test_magnitude_rule_is_an_equivalence_band_a_wide_interval_cannot_win():
    band = Band(16, 8, 32)
    assert magnitude_verdict(band, Interval(12, 9, 20)) == REPRODUCED
    assert magnitude_verdict(band, Interval(11.6, 10.5, 13.0)) == REPRODUCED
    assert magnitude_verdict(band, Interval(4.75, 4.35, 5.27)) == NOT_REPRODUCED
    assert magnitude_verdict(band, Interval(50, 40, math.inf)) == NOT_REPRODUCED
    assert magnitude_verdict(band, None) == INCONCLUSIVE
    # overlapping the band without lying inside it: inconclusive
    assert magnitude_verdict(band, Interval(7, 5, 9)) == INCONCLUSIVE
    # a half-unbounded interval is never reproduced, however its value sits (the old rule's
    # "18.2 [14.7, unbounded]" case)
    assert magnitude_verdict(band, Interval(18.2, 14.7, math.inf)) == INCONCLUSIVE
    assert magnitude_verdict(band, Interval(12, -math.inf, 20)) == INCONCLUSIVE
    # widening an interval can only move the verdict towards inconclusive
    for width in (1, 5, 10, 30):
        wider = magnitude_verdict(band, Interval(16, 16 - width, 16 + width))
        assert wider == (REPRODUCED if width <= 8 else INCONCLUSIVE)
    with pytest.raises(ValueError, match="band"):
        Band(16, 20, 32)
    with pytest.raises(ValueError, match="band"):
        Band(16, 8, math.inf)


def test_learned_gate_names_the_failed_model_and_check():
    passed = LearnedCheck("AR", "loss 0.1 below the unigram entropy", "3.1 < 4.9", True)
    failed = LearnedCheck("MDM", "loss 0.1 below the unigram entropy", "4.95 vs 4.9", False)
    assert learned_gate(REPRODUCED, [passed], "more steps") == (REPRODUCED, [])
    verdict, notes = learned_gate(NOT_REPRODUCED, [passed, failed], "2000 steps at d256")
    assert verdict == NOT_TRAINED
    assert "MDM failed the check 'loss 0.1 below the unigram entropy'" in notes[0]
    assert "*not reproduced*" in notes[0] and "2000 steps at d256" in notes[-1]
    with pytest.raises(ValueError, match="learned checks"):
        learned_gate(REPRODUCED, [], "x")


def test_intervals_must_contain_their_value_and_seeds_must_pair():
    with pytest.raises(ValueError, match="contain"):
        Interval(5, 0, 1)
    assert all_seeds_agree([1, 2], [2, 3]) and not all_seeds_agree([1, 4], [2, 3])
    with pytest.raises(ValueError, match="equal"):
        all_seeds_agree([1], [1, 2])


# ---- each finding's rule on constructed measurements ---------------------------------------------


def facts_seed(ar_reverse: float, mdm_reverse: float, learned: float = 1.0) -> dict:
    return {
        "ar": {
            "forward_accuracy": learned,
            "reverse_paired_accuracy": 1.0,
            "reverse_held_out_accuracy": ar_reverse,
            "reverse_scored_accuracy": 1.0,
        },
        "mdm": {
            "forward_accuracy": 1.0,
            "reverse_paired_accuracy": 1.0,
            "reverse_held_out_accuracy": mdm_reverse,
            "infill_reverse_accuracy": 1.0,
        },
    }


@pytest.mark.parametrize(
    "seeds, verdict",
    [
        ([(0.0, 1.0), (1 / 13, 1.0), (0.0, 12 / 13)], REPRODUCED),
        ([(1.0, 0.0), (1.0, 1 / 13), (12 / 13, 0.0)], NOT_REPRODUCED),
        # both at chance: the MDM does not answer, so the claim is not reproduced
        ([(1 / 13, 0.0), (0.0, 1 / 13), (0.0, 0.0)], NOT_REPRODUCED),
        ([(0.5, 0.6), (0.5, 0.55), (0.6, 0.5)], INCONCLUSIVE),
        # separated pooled intervals, but one seed goes the other way
        ([(0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.3, 0.2)], INCONCLUSIVE),
    ],
)
def test_reversal_verdicts(tmp_path, seeds, verdict):
    settings = reversal.ReversalSettings(tuple(range(len(seeds))), 26, 13, 100, "tiny")
    per_seed = [facts_seed(a, m) for a, m in seeds]
    result = reversal.judge("smoke", settings, per_seed, tmp_path)
    assert result.verdict == verdict
    text = (tmp_path / "report.md").read_text()
    assert text.index("Rule (reversal)") < text.index("Accuracy over the facts")
    # the label is the registration's own status, not just some label
    status = json.loads((tmp_path / "report.json").read_text())["results"]["registration"]
    label = "Exploratory run" if status["status"] == "exploratory" else "Pre-registered"
    assert label in text and result.registration == status["status"]


def test_reversal_is_not_trained_when_the_ar_misses_forward_facts(tmp_path):
    settings = reversal.ReversalSettings((0, 1, 2), 26, 13, 100, "tiny")
    per_seed = [facts_seed(0.0, 1.0, learned=0.6) for _ in range(3)]
    result = reversal.judge("smoke", settings, per_seed, tmp_path)
    assert result.verdict == NOT_TRAINED
    assert result.numbers["comparison_verdict"] == REPRODUCED
    failed = "AR failed the check 'forward accuracy >= 0.9, every seed'"
    assert any(failed in note for note in result.notes)


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


def dc_curve(losses: list[float], per_epoch: float = 1.0) -> list[dict]:
    """Validations at epochs 1/per_epoch, 2/per_epoch, ... (8 steps per epoch)."""
    return [
        {"step": 8 * (i + 1), "epoch": (i + 1) / per_epoch, "val_nats_per_token": loss}
        for i, loss in enumerate(losses)
    ]


AR_OVERFITS = [5.0, 4.0, 3.5, 3.6, 3.9, 4.3, 4.8, 5.2]
FRESH = [5.0, 3.9, 3.3, 3.0, 2.8, 2.6, 2.5, 2.4]
MDM_FLAT = [6.0, 5.0, 4.5, 4.2, 4.1] + [4.05] * 10
MDM_BELOW = [6.0, 5.0, 4.5, 4.0, 3.6, 3.4, 3.3, 3.25, 3.2, 3.15]
MDM_FALLING = [6.0, 5.8, 5.6, 5.4, 5.2, 5.0, 4.8, 4.6, 4.4, 4.2]


def dc_seed(mdm: list[float], shift: float = 0.0) -> dict:
    return {
        "ar-wd0.1": dc_curve([x + shift for x in AR_OVERFITS]),
        "ar-wd1": dc_curve([x + shift + 0.05 for x in AR_OVERFITS]),
        "ar-fresh": dc_curve(FRESH),
        "mdm": dc_curve([x + shift for x in mdm], per_epoch=0.5),
    }


@pytest.mark.parametrize(
    "mdm, unigram, verdict",
    [
        (MDM_BELOW, 6.5, REPRODUCED),
        # above the AR and flat at the end: refuted at this budget
        (MDM_FLAT, 6.5, NOT_REPRODUCED),
        # above the AR and still falling: short of the claim's regime
        (MDM_FALLING, 6.5, INCONCLUSIVE),
        # the MDM never gets 0.1 nats below the unigram entropy: not trained
        (MDM_FLAT, 4.1, NOT_TRAINED),
    ],
)
def test_data_constrained_verdicts(tmp_path, mdm, unigram, verdict):
    settings = data_constrained.SETTINGS["smoke"]
    runs = {seed: dc_seed(mdm, 0.01 * seed) for seed in range(3)}
    result = data_constrained.judge("smoke", settings, runs, unigram, tmp_path)
    assert result.verdict == verdict
    assert (tmp_path / "data_constrained_curves.png").exists()
    assert result.numbers["ar_best"][0]["run"] == "ar-wd0.1"  # the better of the sweep
    # three seeds whose best epochs (AR 3, MDM >= 16) agree to 0.02: the AR's best is earlier
    assert result.numbers["peak_verdict"] == REPRODUCED
    assert "AR earlier: **reproduced**" in (tmp_path / "report.md").read_text()


def test_data_constrained_plateau_and_half_life():
    assert data_constrained.plateaued(dc_curve(MDM_FLAT))
    assert not data_constrained.plateaued(dc_curve(MDM_FALLING))
    assert not data_constrained.plateaued(dc_curve([3.0]))  # too short to say
    # effective epochs from the fresh curve: equal losses at equal epochs are worth 1:1
    same = reuse_half_life.effective_epochs(dc_curve(FRESH[:4]), dc_curve(FRESH))
    assert [e for e, _ in same] == [1.0, 2.0, 3.0, 4.0]
    assert [w for _, w in same] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    # only up to the repeated run's best (the form describes diminishing returns, not overfit)
    overfit = reuse_half_life.effective_epochs(dc_curve(AR_OVERFITS), dc_curve(FRESH))
    assert [e for e, _ in overfit] == [1.0, 2.0, 3.0]
    # R* recovered from points made by the form itself
    points = [(e, 1 + 5.0 * (1 - math.exp(-(e - 1) / 5.0))) for e in range(1, 30)]
    assert reuse_half_life.fit_half_life(points)["r_star"] == pytest.approx(5.0, rel=1e-3)
    # repetitions worth as much as fresh data: no saturation, the fit runs into its bound
    assert reuse_half_life.fit_half_life([(e, e) for e in range(1, 10)])["at_bound"]
    assert reuse_half_life.fit_half_life([(1.0, 1.0)]) is None


def gap_size(interval: Interval | None, window: int = 0, mdm_points: int = 2) -> dict:
    points = [
        {"flops": 1e9 * (i + 1), "loss": 5.0 - i, "steps": 10 * (i + 1), "epochs": 0.1}
        for i in range(2)
    ]
    spread = {"text": "0.2 [0.1, 0.3]"}
    return {
        "size": {"dim": 64},
        "parameters": 1000,
        "unigram": 5.2,
        "window": window,
        "past_plateau": {0: {"ar": 2, "mdm": mdm_points}, 1: {"ar": 3, "mdm": 2}},
        "analysis": {
            "seeds": {0: {"curve": [(4.5, 14.0), (4.2, 15.0)]}, 1: {"curve": []}},
            "exponents": {"ar": spread, "mdm": spread},
            "fitted_multiplier": None,
        },
        "interval": None if interval is None else interval.as_dict(),
        "points": {0: {"points": {"ar": points, "mdm": points}}},
    }


def gap_settings() -> compute_gap.GapSettings:
    """The smoke settings with the two seeds gap_size measures (smoke itself trains one)."""
    smoke = compute_gap.SETTINGS["smoke"]
    return replace(smoke, budgets=replace(smoke.budgets, seeds=(0, 1)))


@pytest.mark.parametrize(
    "interval, window, mdm_points, verdict",
    [
        (Interval(15, 12, 19), 0, 2, REPRODUCED),
        (Interval(11.6, 10.5, 13.0), 0, 2, REPRODUCED),
        (Interval(4.75, 4.35, 5.27), 0, 2, NOT_REPRODUCED),
        # an interval open above is never reproduced (the old rule's 18.2 [14.7, unbounded])
        (Interval(18.2, 14.7, math.inf), 0, 2, INCONCLUSIVE),
        (None, 0, 2, INCONCLUSIVE),
        # windowed attention: not comparable with SMDM, whatever the band says
        (Interval(15, 12, 19), 8, 2, INCONCLUSIVE),
        # the MDM has one budget point past its plateau in seed 0: not trained
        (Interval(15, 12, 19), 0, 1, NOT_TRAINED),
    ],
)
def test_compute_gap_verdict_is_the_band_at_the_largest_size(
    tmp_path, interval, window, mdm_points, verdict
):
    measured = [gap_size(Interval(3, 2, 4)), gap_size(interval, window, mdm_points)]
    result = compute_gap.judge("smoke", gap_settings(), measured, tmp_path)
    assert result.verdict == verdict
    # the smaller size's direction (AR ahead: interval above 1) is judged and reported too
    assert result.numbers["direction_verdicts"][0] == REPRODUCED
    text = (tmp_path / "report.md").read_text()
    assert ("not comparable" in text) == bool(window)
    assert "M(L) at d64, per seed" in text
    # the attention preface comes first, before the claim and the rules
    preface = text.split("\n\n")[1]
    assert preface.startswith("**Attention.**") and text.index(preface) < text.index("**Rule")
    assert ("not comparable" in preface) == bool(window)


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
        "mean_length": 60.0,
        "empty_share": 0.0,
    }


def test_sample_quality_ordering_needs_comparable_entropy():
    ar, bd = judged_set("AR", 5, 0.1, 4.0), judged_set("BD", 6, 0.1, 4.0)
    mdm = judged_set("MDM", 7, 0.1, 4.0)
    assert quality.ordered(ar, bd) == REPRODUCED and quality.ordered(bd, mdm) == REPRODUCED
    assert quality.ordered(mdm, ar) == NOT_REPRODUCED
    repetitive = judged_set("AR", 5, 0.1, 3.0)  # lower perplexity bought with 25% less entropy
    assert quality.ordered(repetitive, bd) == INCONCLUSIVE
    # the check reads whichever side wins: a reversal won by repetition is no refutation
    assert quality.ordered(bd, repetitive) == INCONCLUSIVE
    assert quality.ordered(mdm, judged_set("AR", 5, 0.1, 3.9)) == NOT_REPRODUCED
    # ... and it applies to the steps half too: fewer steps winning only by repetition
    sets = {
        "MDM 16 steps": judged_set("MDM", 7, 0.1, 4.0, 16, 1),
        "MDM 4 steps": judged_set("MDM", 6, 0.1, 3.0, 4, 4),
        "BD 16 steps": judged_set("BD", 6, 0.1, 3.0, 16, 1),
        "BD 4 steps": judged_set("BD", 7, 0.1, 4.0, 4, 4),
    }
    assert quality.steps_half(sets, "BD") == {"BD": INCONCLUSIVE, "MDM": INCONCLUSIVE}
    sets["MDM 4 steps"]["unigram_entropy"] = 4.0
    sets["BD 16 steps"]["unigram_entropy"] = 4.0
    assert quality.steps_half(sets, "BD") == {"BD": REPRODUCED, "MDM": NOT_REPRODUCED}
    assert before_eos([5, 6, 2, 7], 2) == [5, 6] and before_eos([5, 6], 2) == [5, 6]
    assert quality.combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert quality.combine([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert quality.combine([INCONCLUSIVE, NOT_REPRODUCED]) == NOT_REPRODUCED
    # ... and to length: a lead over samples more than 25% shorter is no lead (either side)
    short = judged_set("AR", 5, 0.1, 4.0) | {"mean_length": 44.0}
    assert quality.ordered(short, bd) == INCONCLUSIVE and quality.ordered(bd, short) == INCONCLUSIVE
    assert quality.ordered(judged_set("AR", 5, 0.1, 4.0) | {"mean_length": 46.0}, bd) == REPRODUCED
    # token-weighted: a sample with no judge tokens (its rate NaN) does not count
    interval = quality.log_ppl_interval([1.0, 2.0, 3.0, float("nan")], [10, 10, 10, 0])
    assert interval.value == 2.0 and interval.high - 2.0 == pytest.approx(1.959964 / math.sqrt(3))


class SpaceFriendlyJudge:
    """A judge that finds one space very likely (0.1 nats, one token) and every written sample
    hard (5 nats/token, one judge token per character): what an empty sample judged as a space
    would pull the perplexity down with."""

    identity = "test judge"

    def score(self, texts):
        per_token = [0.1 if text == " " else 5.0 for text in texts]
        tokens = [1 if text == " " else len(text) for text in texts]
        nats = sum(rate * count for rate, count in zip(per_token, tokens))
        return JudgeScore(nats, sum(tokens), per_token, tokens)


def test_an_empty_sample_is_left_out_of_the_findings_perplexity_and_counted(monkeypatch):
    monkeypatch.setattr(quality, "load_judge", lambda name: SpaceFriendlyJudge())
    sets = {"MDM 4 steps": {"model": "MDM", "steps": 4}}
    sets["MDM 4 steps"] |= {"texts": ["ab", "", "abcd", ""], "ids": [[5, 6], [], [5, 6, 7, 5], []]}
    settings = quality.QualitySettings((0,), "smoke", 4, 4, 16, (1,))
    entry = quality.judge_all(sets, settings)["sets"]["MDM 4 steps"]
    assert entry["empty_share"] == 0.5 and entry["mean_length"] == 1.5
    assert entry["per_sample_tokens"] == [2, 0, 4, 0]
    assert entry["log_ppl"]["value"] == pytest.approx(5.0)  # the two spaces would make it 3.77
    # the entropy is the written samples' own (log 2 and 1.5 log 2), averaged over two, not four
    assert entry["unigram_entropy"] == pytest.approx((math.log(2) + 1.5 * math.log(2)) / 2)


QUALITY_SETS = {
    "AR": ("AR", 5, 16, 1),
    "BD-4 16 steps": ("BD-4", 6, 16, 1),
    "BD-4 4 steps": ("BD-4", 6.5, 4, 4),
    "MDM 16 steps": ("MDM", 7, 16, 1),
    "MDM 4 steps": ("MDM", 7.5, 4, 4),
}


def quality_seed(shift: dict[str, float] | None = None, noise: float = 0.05) -> dict:
    """One seed's judged sets: 20 samples per set around the set's log perplexity."""
    sets = {}
    for name, (model, log_ppl, steps, divisor) in QUALITY_SETS.items():
        centre = log_ppl + (shift or {}).get(name, 0.0)
        per_sample = [centre + noise * ((i % 5) - 2) for i in range(20)]
        sets[name] = judged_set(model, centre, 0.01, 4.0, steps, divisor) | {
            "per_sample_nats": per_sample,
            "per_sample_tokens": [10] * len(per_sample),
        }
    return {"judge": "test", "sets": sets}


LEARNED = {"unigram": 5.0, "finals": {0: {"ar": 3.0, "bd-4": 3.5, "mdm": 4.0}}}


@pytest.mark.parametrize(
    "shift, verdict",
    [
        ({}, REPRODUCED),
        # the MDM's fewer-step samples are no worse: the steps half fails to separate
        ({"MDM 4 steps": -0.5}, INCONCLUSIVE),
        # fewer steps clearly better for the MDM: that half is reversed
        ({"MDM 4 steps": -1.0}, NOT_REPRODUCED),
    ],
)
def test_sample_quality_both_halves_enter_the_verdict(tmp_path, shift, verdict):
    settings = quality.QualitySettings((0, 1, 2), "smoke", 4, 20, 16, (1, 4))
    per_seed = {seed: quality_seed(shift) for seed in range(3)}
    judged = {"judge": "test", "sets": quality.merge_seeds(per_seed)}
    assert judged["sets"]["AR"]["samples"] == 60
    result = quality.judge("smoke", settings, judged, tmp_path, LEARNED)
    assert result.verdict == verdict


def test_sample_quality_seed_spread_widens_the_interval_and_gate(tmp_path):
    # seeds whose means differ by 0.4 nats: the t interval over seeds dominates
    per_seed = {s: quality_seed({"AR": 0.2 * s}) for s in range(3)}
    merged = quality.merge_seeds(per_seed)["AR"]
    over_samples = Interval(**merged["log_ppl_over_samples"])
    interval = Interval(**merged["log_ppl"])
    assert interval.high - interval.low > over_samples.high - over_samples.low
    assert interval.high - interval.value == pytest.approx(4.302653 * 0.2 / math.sqrt(3))
    settings = quality.QualitySettings((0, 1, 2), "smoke", 4, 20, 16, (1, 4))
    judged = {"judge": "test", "sets": quality.merge_seeds({0: quality_seed()})}
    stuck = {"unigram": 4.05, "finals": {0: {"ar": 3.0, "bd-4": 3.5, "mdm": 4.0}}}
    result = quality.judge("smoke", settings, judged, tmp_path, stuck)
    assert result.verdict == NOT_TRAINED
    assert any("MDM failed" in note for note in result.notes)


def star_probe(exact: float, first: float, lookup: float = 1.0, n: int = 500) -> dict:
    return {
        "exact_match": exact,
        "first_step": first,
        "node_accuracy": exact,
        "n": n,
        "position_accuracy": [1.0, first, exact],
        "decoding_step": None,
        "lookup_accuracy": lookup,
    }


def star_seed(ar_first: float, mdm_exact: float, control=1.0, mdm_lookup=1.0) -> dict:
    return {
        "degree": 2,
        "ar": star_probe(ar_first, ar_first),
        "mdm": star_probe(mdm_exact, mdm_exact, mdm_lookup) | {"decoding_step": [2.0, 1.0, 0.0]},
        "ar-reversed": star_probe(control, 1.0),
    }


@pytest.mark.parametrize(
    "seeds, verdict",
    [
        # the MDM solves it, the AR's first step sits at 1/2: reproduced
        ([(0.5, 0.97), (0.49, 0.96), (0.51, 0.98)], REPRODUCED),
        # the MDM learned its lookups but does not plan: not reproduced
        ([(0.5, 0.3), (0.5, 0.35), (0.5, 0.28)], NOT_REPRODUCED),
        # the AR plans (first step far above chance): not reproduced
        ([(0.9, 0.97), (0.92, 0.96), (0.91, 0.98)], NOT_REPRODUCED),
        # the MDM's seeds straddle the threshold: inconclusive
        ([(0.5, 0.8), (0.5, 0.99), (0.5, 0.95)], INCONCLUSIVE),
    ],
)
def test_pathstar_verdicts(tmp_path, seeds, verdict):
    measured = {"d2-l2": [star_seed(ar, mdm) for ar, mdm in seeds]}
    result = pathstar.judge("smoke", pathstar.SETTINGS["smoke"], measured, tmp_path)
    assert result.verdict == verdict
    assert "MDM decoding step" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    "control, mdm_lookup, failed", [(0.6, 1.0, "path reversed"), (1.0, 0.25, "MDM (d2-l2)")]
)
def test_pathstar_is_not_trained_without_the_control_or_the_lookups(
    tmp_path, control, mdm_lookup, failed
):
    seeds = [star_seed(0.5, 0.3, control, mdm_lookup) for _ in range(3)]
    result = pathstar.judge("smoke", pathstar.SETTINGS["smoke"], {"d2-l2": seeds}, tmp_path)
    assert result.verdict == NOT_TRAINED
    assert any(failed in note for note in result.notes)


def adaptation_seed(adapted: list[float], scratch: list[float]) -> dict:
    curves = {
        "ar": curve([5, 4, 3]),
        "mdm-scratch": curve(scratch),
        "mdm-adapted": curve(adapted),
    }
    summaries = {name: {"step": 8, "init_from": {"total_flops": 3e9}} for name in curves}
    return {"curves": curves, "summaries": summaries}


SCRATCH = [6.0, 5.5, 5.0, 4.5]


@pytest.mark.parametrize(
    "adapted, verdict",
    [
        # reaches the scratch run's final 4.5 at its first point (1e9 FLOPs of 4e9): >= 4x
        ([[4.4, 4.0, 3.8, 3.7], [4.45, 4.1, 3.9, 3.8], [4.3, 4.0, 3.9, 3.8]], REPRODUCED),
        # reaches it between its first and second points: about 2.6x in every seed
        ([[4.6, 4.4, 4.0, 3.8]] * 3, REPRODUCED),
        # never reaches it: saved nothing (1x) in every seed
        ([[6.5, 6.0, 5.5, 5.2]] * 3, NOT_REPRODUCED),
        # 4x, 2x, 1x: the interval straddles 2x
        ([[4.4, 4.0, 3.8, 3.7], [5.0, 4.5, 4.0, 3.8], [6.5, 6.0, 5.5, 5.2]], INCONCLUSIVE),
    ],
)
def test_adaptation_verdict_from_the_seed_interval_of_the_saving(tmp_path, adapted, verdict):
    per_seed = {seed: adaptation_seed(a, SCRATCH) for seed, a in enumerate(adapted)}
    settings = adaptation.SETTINGS["smoke"]
    result = adaptation.judge("smoke", settings, per_seed, 6.0, tmp_path)
    assert result.verdict == verdict
    # the words follow the saving's point estimate: at least 1x is "less", below it "more"
    saving = result.numbers["saving"]["value"]
    assert ("x less" if saving >= 1 else "x more") in result.measured.split(";")[0]


def test_adaptation_saving_and_words():
    curves = adaptation_seed([5.0, 4.5, 4.0, 3.8], SCRATCH)["curves"]
    saving = adaptation.compute_saving(curves["mdm-adapted"], curves["mdm-scratch"], 3e9)
    # the adapted curve reaches the scratch run's final 4.5 exactly at its second point (2e9)
    assert saving["needed_flops"] == pytest.approx(2e9)
    assert saving["saving"] == pytest.approx(2.0)
    assert saving["saving_with_ar"] == pytest.approx(4e9 / 5e9)
    assert adaptation.factor_text(Interval(0.8, 0.7, 0.9)).startswith("1.2x more")
    assert adaptation.factor_text(Interval(4.0, 3.0, 5.0)).startswith("4x less")


def test_adaptation_is_not_trained_when_the_scratch_mdm_stays_on_the_plateau(tmp_path):
    per_seed = {s: adaptation_seed([5.0, 4.5, 4.0, 3.8], SCRATCH) for s in range(3)}
    # unigram entropy 4.55: the scratch MDM's 4.5 is not 0.1 below it
    result = adaptation.judge("smoke", adaptation.SETTINGS["smoke"], per_seed, 4.55, tmp_path)
    assert result.verdict == NOT_TRAINED
    assert any("MDM from scratch failed" in note for note in result.notes)


# ---- end to end ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_finding_runs_at_smoke_scale_and_writes_its_index(tmp_path):
    """The plumbing of every finding (the verdicts at this scale mean nothing)."""
    out = tmp_path / "findings"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["--scale", "smoke", "--out", str(out), *cache]) == 0
    index = json.loads((out / "index.json").read_text())
    assert [row["name"] for row in index["findings"]] == list(FINDINGS)
    for row in index["findings"]:
        report_json = json.loads((out / row["name"] / "report.json").read_text())
        # the index row is the report's own verdict, and the report says it under its rules
        assert row["verdict"] == report_json["results"]["verdict"]
        report = (out / row["name"] / "report.md").read_text()
        assert report.index("**Rule") < report.index(f"## Verdict: **{row['verdict']}**")
        seeds = json.loads((out / row["name"] / "report.json").read_text())["provenance"]["seeds"]
        expected = getattr(FINDINGS[row["name"]].settings["smoke"], "seeds", (0,))
        assert seeds == {"train": list(expected)}
    markdown = (out / "index.md").read_text()
    assert markdown.count("/report.md)") == len(FINDINGS)


@pytest.mark.slow
def test_a_rerun_reuses_every_run_and_stage(tmp_path, capsys):
    """A rerun of the same code and settings trains and probes nothing again."""
    out, cache = tmp_path / "findings", ["--cache-dir", str(tmp_path / "cache")]
    argv = ["--scale", "smoke", "--out", str(out), "--only", "reversal", *cache]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "reusing" not in first
    row = json.loads((out / "index.json").read_text())["findings"][0]
    report = json.loads((out / "reversal" / "report.json").read_text())
    assert row["verdict"] == report["results"]["verdict"]
    # the rerun stands for one at a later commit of the same source: it keeps the runs' commit
    stamp_path = out / "reversal" / "finding-code.json"
    stamp = json.loads(stamp_path.read_text())
    stamp_path.write_text(json.dumps(stamp | {"git_commit": "0" * 40}))
    assert main(argv) == 0
    rerun = capsys.readouterr().out
    text = (out / "reversal" / "report.md").read_text()
    assert f"made by commit `{'0' * 40}`" in text
    row = json.loads((out / "index.json").read_text())["findings"][0]
    assert row["provenance"]["runs_commit"] == "0" * 40
    assert row["provenance"]["source_hash"] == stamp["source_hash"]
    seeds = FINDINGS["reversal"].settings["smoke"].seeds
    assert rerun.count("reusing the finished run") == 2 * len(seeds)  # AR and MDM per seed
    assert rerun.count("reusing the stored result") == len(seeds)  # the probes
    assert "moved the earlier job aside" not in rerun and "] done in" not in rerun


def test_findings_table_quotes_the_index_and_says_why_a_finding_is_long(
    tmp_path, capsys, monkeypatch
):
    claim = {"title": "T", "statement": "S.", "source": "X 2024"}
    rows = [
        {
            "name": "a",
            "claim": claim,
            "measured": "1 [0, 2]",
            "verdict": REPRODUCED,
            "wall_seconds": 1500,
            "registration": "pre-registered",
            "provenance": {"git_commit": "0123456789abcdef", "git_dirty": False},
        },
        {
            "name": "b",
            "claim": claim,
            "measured": "3",
            "verdict": NOT_TRAINED,
            "wall_seconds": 60,
            "registration": "exploratory",
        },
    ]
    text = findings_table({"findings": rows}, "docs/x", {"a": "9 runs", "b": "1 run"})
    assert (
        "| [T](docs/x/a/report.md) | S. (X 2024) | 1 [0, 2] | **reproduced** | pre-registered | "
        "25.0 min (over 20: 9 runs) | `0123456` |" in text
    )
    assert "| **inconclusive (not trained)** | exploratory | 1.0 min | not recorded |" in text
    # labels checked now replace the rows' own
    checked = findings_table({"findings": rows}, "docs/x", {}, {"a": "registered after the result"})
    assert "| **reproduced** | registered after the result | 25.0 min |" in checked
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"findings": rows}))
    monkeypatch.chdir(tmp_path)  # REPORTS is relative to where the table is shown
    for name in ("a", "b"):
        (tmp_path / "docs" / "x" / name).mkdir(parents=True)
        (tmp_path / "docs" / "x" / name / "report.md").write_text("# report")
    assert main(["--table", str(index), "docs/x"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[2].startswith("| [T](docs/x/a/report.md)")


def full_history(root: Path) -> bool:
    """Whether ``root`` is a git checkout with its whole history (what the registration check
    reads); a shallow clone or an unpacked archive has not."""
    return git_output("rev-parse", "--is-shallow-repository", cwd=root) == "false"


def test_readme_findings_table_is_the_committed_index():
    """The README's findings table is generated from the committed cpu index (never typed), its
    registration labels checked from git now, and the index's stored labels are those too."""
    root = Path(__file__).resolve().parent.parent
    if not full_history(root):
        pytest.skip("registration labels are checked from git: this checkout has no full history")
    index = json.loads((root / "docs/studies/findings-cpu/index.json").read_text())
    costs = {name: finding.cost for name, finding in FINDINGS.items()}
    labels = checked_labels(index, root)
    assert {row["name"]: row["registration"] for row in index["findings"]} == labels
    table = findings_table(index, "docs/studies/findings-cpu", costs, labels)
    assert table in (root / "README.md").read_text()


def test_unknown_finding_is_one_clear_error(tmp_path, capsys):
    assert main(["--scale", "smoke", "--out", str(tmp_path), "--only", "nope"]) == 2
    assert "unknown finding(s) ['nope']" in capsys.readouterr().err


# ---- the rules' former holes, each on constructed inputs ----------------------------------------


def test_reversal_from_one_seed_is_inconclusive_and_says_why(tmp_path):
    settings = reversal.ReversalSettings((0,), 26, 13, 100, "tiny")
    result = reversal.judge("smoke", settings, [facts_seed(0.0, 1.0)], tmp_path)
    assert result.verdict == INCONCLUSIVE
    assert any("One training seed" in note for note in result.notes)
    assert "One training seed" in (tmp_path / "report.md").read_text()


def test_reversal_gate_holds_in_every_seed(tmp_path):
    # five seeds learned the forward facts, one did not: the pooled 0.93 would pass the gate
    settings = reversal.ReversalSettings(tuple(range(6)), 26, 13, 100, "tiny")
    per_seed = [facts_seed(0.0, 1.0)] * 5 + [facts_seed(0.0, 1.0, learned=0.6)]
    result = reversal.judge("smoke", settings, per_seed, tmp_path)
    assert result.verdict == NOT_TRAINED and result.numbers["comparison_verdict"] == REPRODUCED
    assert any("1.000, 1.000, 1.000, 1.000, 1.000, 0.600" in note for note in result.notes)


def test_pathstar_ar_below_chance_is_not_trained_not_a_refutation(tmp_path):
    seeds = [star_seed(0.1, 0.97), star_seed(0.12, 0.96), star_seed(0.08, 0.98)]
    result = pathstar.judge("smoke", pathstar.SETTINGS["smoke"], {"d2-l2": seeds}, tmp_path)
    assert result.verdict == NOT_TRAINED
    assert result.numbers["comparison_verdict"] == INCONCLUSIVE
    assert any("AR (d2-l2) failed the check 'first-step interval" in n for n in result.notes)


def test_pathstar_gate_holds_in_every_seed(tmp_path):
    # the control's pooled exact match 0.967 passes 0.95; its last seed (0.8) does not
    seeds = [star_seed(0.5, 0.97)] * 5 + [star_seed(0.5, 0.97, control=0.8)]
    result = pathstar.judge("smoke", pathstar.SETTINGS["smoke"], {"d2-l2": seeds}, tmp_path)
    assert result.verdict == NOT_TRAINED and result.numbers["comparison_verdict"] == REPRODUCED
    assert any("AR, path reversed (d2-l2) failed" in n for n in result.notes)


def test_adaptation_gates_the_adapted_model(tmp_path):
    # AR and scratch MDM well below the unigram 6.0; the adapted MDM ends at 5.95
    per_seed = {s: adaptation_seed([6.5, 6.2, 6.0, 5.95], SCRATCH) for s in range(3)}
    result = adaptation.judge("smoke", adaptation.SETTINGS["smoke"], per_seed, 6.0, tmp_path)
    assert result.verdict == NOT_TRAINED
    assert result.numbers["comparison_verdict"] == NOT_REPRODUCED
    assert any("MDM adapted failed" in note for note in result.notes)


def test_compute_gap_needs_m_in_every_seed(tmp_path):
    size = gap_size(Interval(15, 12, 19))
    size["analysis"]["unmeasured_seeds"] = [2]  # two seeds read M inside the band, one none
    result = compute_gap.judge("smoke", gap_settings(), [size], tmp_path)
    assert result.verdict == INCONCLUSIVE
    assert any("not read in seed(s) [2]" in note for note in result.notes)
    size["analysis"]["unmeasured_seeds"] = []
    result = compute_gap.judge("smoke", gap_settings(), [size], tmp_path)
    assert result.verdict == REPRODUCED


# ---- provenance --------------------------------------------------------------------------------


def test_a_report_rendered_from_stored_runs_says_so_and_keeps_their_commit(tmp_path):
    settings = reversal.ReversalSettings((0, 1, 2), 26, 13, 100, "tiny")
    per_seed = [facts_seed(0.0, 1.0)] * 3
    fresh = reversal.judge("smoke", settings, per_seed, tmp_path / "fresh")
    assert fresh.provenance["runs_commit"] is None
    assert "Re-rendered" not in (tmp_path / "fresh" / "report.md").read_text()
    out = tmp_path / "stored"
    out.mkdir()
    stamp = {"source_hash": "s", "registration": "r", "git_commit": "abc", "git_dirty": False}
    stamp["started"] = "2026-01-02T03:04:05+00:00"
    (out / "finding-code.json").write_text(json.dumps(stamp))
    result = reversal.judge("smoke", settings, per_seed, out)
    report = json.loads((out / "report.json").read_text())
    assert "made by commit `abc`" in (out / "report.md").read_text()
    assert result.provenance == {
        "git_commit": report["provenance"]["git_commit"],
        "git_dirty": report["provenance"]["git_dirty"],
        "source_hash": report["provenance"]["source_hash"],
        "created": report["provenance"]["created"],
        "registration_status": report["results"]["registration"]["status"],
        "registration_hash": report["results"]["registration"]["hash"],
        "runs_commit": "abc",
        "runs_started": "2026-01-02T03:04:05+00:00",
    }


def test_reindex_rebuilds_the_committed_index_from_its_reports(tmp_path, capsys):
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "findings-cpu"
    shutil.copytree(root / "docs/studies/findings-cpu", out)
    before = json.loads((out / "index.json").read_text())
    assert main(["--reindex", str(out)]) == 0
    index = json.loads((out / "index.json").read_text())
    costs = {name: finding.cost for name, finding in FINDINGS.items()}
    assert findings_table(index, ".", costs) == findings_table(before, ".", costs)
    for row in index["findings"]:
        report = json.loads((out / row["name"] / "report.json").read_text())
        assert row["provenance"]["git_commit"] == report["provenance"]["git_commit"]
        assert row["provenance"]["source_hash"] == report["provenance"]["source_hash"]
        assert row["provenance"]["registration_hash"] == report["results"]["registration"]["hash"]
        assert row["report"] == f"{row['name']}/report.md"
    markdown = (out / "index.md").read_text()
    assert "Index rebuilt from the stored reports" in markdown
    assert index["findings"][0]["provenance"]["git_commit"] in markdown


def test_reindex_of_a_folder_without_findings_is_one_line(tmp_path, capsys):
    assert main(["--reindex", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no finding's result.json" in err
    assert list(tmp_path.iterdir()) == []
