"""The synthetic preset of the comparison runs end to end (its smoke version, as CI runs it)."""

import json
import math
import re

import pytest

from eval.experiments import compare
from eval.experiments.stages import training_seed
from eval.experiments.synthetic_compare import probe_rows


@pytest.mark.slow
def test_synthetic_smoke_report_has_exact_metrics_and_plots(tmp_path):
    out = tmp_path / "synthetic"
    args = ["--preset", "synthetic-smoke", "--out", str(out), "--cache-dir", str(tmp_path / "c")]
    assert compare.main(args) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["provenance"]["seeds"] == {
        "train": training_seed(out / "hmm" / "ar"),
        "sampling": 0,
    }
    languages = data["results"]["languages"]
    assert set(languages) == {"hmm", "pcfg", "facts"}
    for label, result in languages.items():
        assert result["language"]["entropy"]["nats_per_token"] > 0
        for model in ("ar", "mdm"):
            likelihood = result[model]["likelihood"]
            assert math.isfinite(likelihood["gap_to_true_nll"]), (label, model)
            assert math.isfinite(likelihood["gap_to_entropy"]), (label, model)
            assert 0 <= result[model]["samples"]["valid_fraction"] <= 1
        # The NELBO is an upper bound on the true NLL of the same strings: a gap far below zero
        # means the bound leaks information (padding left visible once gave the length away).
        mdm = result["mdm"]["likelihood"]
        assert mdm["gap_to_true_nll"] > -3 * mdm["gap_to_true_nll_stderr"], label
        tokens = {m: result["training"][m]["tokens_seen"] for m in ("ar", "mdm")}
        assert tokens["ar"] == tokens["mdm"] > 0  # matched budget
    assert "infill" in languages["hmm"]["mdm"] and "infill_prefix_only" in languages["hmm"]["ar"]
    assert "completion" in languages["pcfg"]["ar"]
    ar, mdm = languages["facts"]["ar"]["reversal"], languages["facts"]["mdm"]["reversal"]
    assert ar["chance"] == mdm["chance"] == 1 / 8  # 16 facts, 8 of them paired
    for key in ("forward_accuracy", "reverse_held_out_accuracy", "reverse_scored_accuracy"):
        assert 0 <= ar[key] <= 1, key
    for key in ("forward_accuracy", "reverse_held_out_accuracy", "infill_reverse_accuracy"):
        assert 0 <= mdm[key] <= 1, key
    markdown = (out / "report.md").read_text()
    for row in (
        "| facts | AR | reversal: forward |",
        "| facts | AR | reversal: reverse, held-out facts |",
        "| facts | AR | reversal: reverse, likelihood-scored |",
        "| facts | MDM | reversal: forward |",
        "| facts | MDM | reversal: reverse, held-out facts |",
        "| facts | MDM | reversal: infill position 1 (a training conditional) |",
        "| facts | chance (1/held-out) | reversal |",
    ):
        assert row in markdown, row
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert sorted(images) == ["gap_to_entropy.png", "valid_fraction.png"]
    assert all((out / image).stat().st_size > 1000 for image in images)
    assert compare.main(["--preset", "synthetic-nope", "--out", str(tmp_path / "x")]) == 2


def test_probe_rows_list_each_models_probes_then_the_references():
    hmm = {
        "ar": {"infill_prefix_only": {"mode_agreement": 0.5}},
        "mdm": {"infill": {"mode_agreement": 0.75}},
        "infill_oracle": {"mode_agreement": 1.0},
    }
    assert probe_rows("hmm", hmm) == [
        ["hmm", "AR", "infill_prefix_only", 0.5],
        ["hmm", "MDM", "infill", 0.75],
        ["hmm", "true posterior", "infill", 1.0],
    ]
    reversal = {"forward_accuracy": 1.0, "reverse_held_out_accuracy": 0.25, "chance": 0.125}
    facts = {
        "ar": {"reversal": reversal | {"reverse_paired_accuracy": None}},
        "mdm": {"reversal": reversal | {"infill_reverse_accuracy": 0.5}},
    }
    assert probe_rows("facts", facts) == [
        ["facts", "AR", "reversal: forward", 1.0],
        ["facts", "AR", "reversal: reverse, held-out facts", 0.25],
        ["facts", "MDM", "reversal: forward", 1.0],
        ["facts", "MDM", "reversal: reverse, held-out facts", 0.25],
        ["facts", "MDM", "reversal: infill position 1 (a training conditional)", 0.5],
        ["facts", "chance (1/held-out)", "reversal", 0.125],
    ]
    assert probe_rows("pcfg", {"ar": {"completion": {"valid_fraction": 0.5}}, "mdm": {}}) == [
        ["pcfg", "AR", "completion", 0.5]
    ]
