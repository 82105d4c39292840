"""The uniform-vs-masked finding: its rules on constructed inputs (each part's verdicts, the entropy
check on either side, equal compute, the learned gate), its registration, and its smoke scale end
to end."""

import json

import pytest

from eval.findings import registration
from eval.findings import uniform_masked as duality
from eval.findings.__main__ import main
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TRAINED,
    REPRODUCED,
    Interval,
)

SETTINGS = duality.DualitySettings((0, 1, 2), "smoke", 20, 16, (2, 4))
# log judge perplexity per set (nats/token); UDM clearly below MDM at both few step counts
BASE = {"MDM 2": 7.0, "MDM 4": 6.8, "MDM 16": 6.0, "UDM 2": 5.5, "UDM 4": 5.4, "UDM 16": 5.3}


def judged_set(name: str, log_ppl: float, entropy: float) -> dict:
    """One seed's judged set of 20 samples around ``log_ppl``."""
    model, steps = name.split()
    per_sample = [log_ppl + 0.05 * ((i % 5) - 2) for i in range(20)]
    return {
        "model": model,
        "steps": int(steps),
        "nfe": int(steps),
        "few": int(steps) in SETTINGS.few_steps,
        "mean_length": 16.0,
        "per_sample_nats": per_sample,
        "per_sample_tokens": [16] * len(per_sample),
        "log_ppl": Interval(log_ppl, log_ppl - 0.02, log_ppl + 0.02).as_dict(),
        "unigram_entropy": entropy,
        "repetition_rate_4gram": 0.0,
    }


def judged(shift: dict | None = None, entropy: dict | None = None) -> dict:
    """Three seeds' sets, merged as the finding merges them."""
    shift, entropy = shift or {}, entropy or {}
    one_seed = {
        "judge": "test",
        "sets": {
            f"{name} steps": judged_set(name, centre + shift.get(name, 0.0), entropy.get(name, 3.0))
            for name, centre in BASE.items()
        },
    }
    return {"judge": "test", "sets": duality.merge_seeds({s: one_seed for s in range(3)})}


def learned(mdm=(4.0, 4.02, 4.01), udm=(4.3, 4.31, 4.33), unigram=5.0, udm_flops=1e12) -> dict:
    runs = {
        seed: {
            "mdm": {"nelbo": m, "flops": 1e12, "step": 40},
            "udm": {"nelbo": u, "flops": udm_flops, "step": 40},
        }
        for seed, (m, u) in enumerate(zip(mdm, udm))
    }
    return {"runs": runs, "unigram": unigram}


def verdict_of(tmp_path, learned_runs: dict, sets: dict):
    return duality.judge("smoke", SETTINGS, learned_runs, sets, tmp_path)


def test_both_parts_reproduced(tmp_path):
    result = verdict_of(tmp_path, learned(), judged())
    assert result.verdict == REPRODUCED
    assert result.numbers["likelihood"]["verdict"] == REPRODUCED
    assert result.numbers["few_steps"] == {"2": REPRODUCED, "4": REPRODUCED}
    report = (tmp_path / "report.md").read_text()
    assert report.index("**(a) Likelihood.**") < report.index("| seed | MDM | UDM |")
    assert "not a refutation" in report


@pytest.mark.parametrize(
    "mdm, verdict",
    [
        ((4.5, 4.52, 4.51), NOT_REPRODUCED),  # the MDM's NELBO above the UDM's in every seed
        ((4.0, 4.52, 4.31), INCONCLUSIVE),  # d_s of both signs: the interval holds 0
    ],
)
def test_likelihood_part(tmp_path, mdm, verdict):
    result = verdict_of(tmp_path, learned(mdm=mdm), judged())
    assert result.numbers["likelihood"]["verdict"] == verdict
    assert result.verdict == verdict


def test_few_step_part_reversed_is_not_reproduced(tmp_path):
    result = verdict_of(tmp_path, learned(), judged(shift={"UDM 4": 2.0}))
    assert result.numbers["few_steps"] == {"2": REPRODUCED, "4": NOT_REPRODUCED}
    assert result.verdict == NOT_REPRODUCED


@pytest.mark.parametrize(
    "shift, entropy",
    [
        ({}, {"UDM 4": 2.5}),  # UDM wins with 17% lower entropy
        ({"UDM 4": 2.0}, {"MDM 4": 2.5}),  # MDM wins with 17% lower entropy
    ],
)
def test_a_lead_bought_with_lower_entropy_is_inconclusive_on_either_side(tmp_path, shift, entropy):
    result = verdict_of(tmp_path, learned(), judged(shift, entropy))
    assert result.numbers["few_steps"] == {"2": REPRODUCED, "4": INCONCLUSIVE}
    assert result.verdict == INCONCLUSIVE


def test_entropy_within_tolerance_keeps_the_verdict(tmp_path):
    sets = judged(shift={"UDM 4": 2.0}, entropy={"MDM 4": 2.9})  # 3% lower: comparable
    assert duality.few_step_parts(SETTINGS, sets["sets"]) == {2: REPRODUCED, 4: NOT_REPRODUCED}


def test_unequal_training_compute_is_inconclusive(tmp_path):
    result = verdict_of(tmp_path, learned(udm_flops=1.02e12), judged())
    assert result.numbers["comparison_verdict"] == INCONCLUSIVE
    assert result.verdict == INCONCLUSIVE
    assert any("Unequal training compute in seed 0" in note for note in result.notes)
    # within 1%: equal compute
    assert verdict_of(tmp_path, learned(udm_flops=1.009e12), judged()).verdict == REPRODUCED


def test_a_model_on_the_unigram_plateau_is_not_trained(tmp_path):
    result = verdict_of(tmp_path, learned(udm=(4.3, 4.95, 4.33)), judged())
    assert result.verdict == NOT_TRAINED
    assert any("UDM failed" in note for note in result.notes)
    assert not any("MDM failed" in note for note in result.notes)


def test_merged_sets_average_the_mean_length_over_seeds():
    per_seed = {}
    for seed, length in enumerate((10.0, 14.0)):
        entry = judged_set("MDM 2", 7.0, 3.0) | {"mean_length": length}
        per_seed[seed] = {"judge": "test", "sets": {"MDM 2 steps": entry}}
    merged = duality.merge_seeds(per_seed)["MDM 2 steps"]
    assert merged["mean_length"] == 12.0 and merged["samples"] == 40


def test_both_samplers_spend_one_evaluation_per_step_with_the_same_tail():
    udm, mdm = duality.sampler("udm", 8), duality.sampler("mdm", 8)
    assert udm.steps == 8 and mdm.strategy.steps == 8 and not mdm.reuse_predictions
    # no greedy last step for either family: a greedy tail for one side only lowers its
    # entropy by about the entropy check's own margin
    assert not udm.greedy_tail and not udm.sampling.greedy and not mdm.sampling.greedy
    assert "no greedy last step for either" in duality.RULE["tail"]


def test_the_finding_is_registered_last_with_both_runs_per_seed():
    registry = registration.load_registry()
    assert set(registry["uniform-vs-masked"]) == {"smoke", "cpu", "gpu"}
    planned = duality.runs(duality.SETTINGS["cpu"])
    assert sorted(planned) == [f"seed-{s}/{m}" for s in (0, 1, 2) for m in ("mdm", "udm")]
    assert {preset for preset, _ in planned.values()} == {"demo"}
    assert all("curriculum_steps" not in start for _, start in planned.values())


@pytest.mark.slow
def test_smoke_scale_end_to_end(tmp_path):
    out = tmp_path / "findings"
    argv = ["--scale", "smoke", "--only", "uniform-vs-masked", "--out", str(out)]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    folder = out / "uniform-vs-masked"
    report = json.loads((folder / "report.json").read_text())
    row = json.loads((out / "index.json").read_text())["findings"][0]
    assert row["name"] == "uniform-vs-masked"
    assert row["verdict"] == report["results"]["verdict"]
    sets = report["results"]["numbers"]["sets"]
    assert sorted(sets) == [f"{m} {k} steps" for m in ("MDM", "UDM") for k in (16, 2, 4)]
    assert all(entry["nfe"] == entry["steps"] for entry in sets.values())
    assert all(0 < entry["mean_length"] <= 16 for entry in sets.values())
    text = (folder / "report.md").read_text()
    assert text.index("**Rule") < text.index(f"## Verdict: **{row['verdict']}**")
