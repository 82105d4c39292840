"""Module paths that moved keep working for one release: the old path gives the new module's
public names (the same objects) and a DeprecationWarning naming the new path; the old command
path still runs."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (old path, new path, a public name of the module)
MOVED = [
    ("eval.throughput", "eval.speed.throughput", "measure"),
    ("eval.throughput_files", "eval.speed.throughput_files", "load"),
    ("eval.throughput_runs", "eval.speed.throughput_runs", "compare_runs"),
    ("eval.speed_ratios", "eval.speed.ratios", "ratio_estimate"),
    ("eval.frontier", "eval.speed.frontier", "frontier"),
    ("eval.frontier_headline", "eval.speed.frontier_headline", "report_frontier"),
    ("eval.synthetic_likelihood", "eval.synthetic.likelihood", "true_entropy"),
    ("eval.synthetic_probes", "eval.synthetic.probes", "reversal_probe"),
    ("eval.synthetic_samples", "eval.synthetic.samples", "sample_metrics"),
    ("eval.pathstar_probe", "eval.synthetic.pathstar_probe", "one_hop_lookups"),
]


@pytest.mark.parametrize("old, new, name", MOVED, ids=[m[0] for m in MOVED])
def test_the_old_path_warns_and_gives_the_new_modules_names(old, new, name):
    sys.modules.pop(old, None)  # the warning comes with the first import
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}\b"):
        shim = importlib.import_module(old)
    assert getattr(shim, name) is getattr(importlib.import_module(new), name)


def test_the_old_synthetic_module_names_read_from_the_package_with_a_warning():
    import eval.synthetic
    from eval.synthetic.report import synthetic_report

    with pytest.warns(DeprecationWarning, match=r"eval\.synthetic\.report\.synthetic_report"):
        assert eval.synthetic.synthetic_report is synthetic_report
    with pytest.raises(AttributeError):
        eval.synthetic.no_such_name  # noqa: B018


def test_the_new_paths_import_without_a_warning():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "import eval.speed.throughput_runs, eval.speed.frontier_headline\n"
        "import eval.synthetic.report\n"
        "from eval.synthetic import likelihood, probes, samples, pathstar_probe"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_old_command_path_still_runs(tmp_path):
    missing = tmp_path / "missing.json"
    done = subprocess.run(
        [sys.executable, "-m", "eval.throughput_runs", str(missing), str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "missing.json" in done.stderr
