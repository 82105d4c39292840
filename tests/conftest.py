"""One thread per test process, two test processes on a two-core machine.

Each process runs one thread: the machine is shared and two OpenMP threads can stall badly. The
README's command runs the suite in two pytest-xdist workers (``-n 2`` in pyproject.toml); how the
tests are shared between them is in ``tests/scheduling.py``. Tiny runs that several modules read
are built once per test run for both workers (``shared_run_dir``).
"""

import fcntl
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# Run from a checkout without installing: the repository root holds the packages.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Shared exact-reference helpers (tests/exact_mdm.py) import by module name.
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import scheduling  # noqa: E402

from shared import checkpoint as ckpt  # noqa: E402
from shared import hardware  # noqa: E402
from shared.tokenizer import Tokenizer  # noqa: E402
from shared.training import cli  # noqa: E402

# The tests whose numbers depend on the CPU's kernels: they compare against numbers recorded on
# another machine (the compat fixture), against outside implementations (transformers' Llama,
# litgpt, lm-evaluation-harness), or against exact values by enumeration and hand computation
# with a floating-point tolerance. CI runs them a second time under a lower ATen CPU capability
# (.ci/run, docs/tests.md), so a tolerance that holds only on the machine that wrote it fails
# there, not on a user's first run.
NUMERICS_MODULES = {
    "test_compat.py",
    "test_model.py",
    "test_export.py",
    "test_generate.py",
    "test_objectives.py",
    "test_likelihood.py",
    "test_samplers.py",
    "test_sampling.py",
    "test_synthetic.py",
    "test_block_diffusion.py",
    "test_train_peers.py",
    "test_harness.py",
}


def pytest_configure(config):
    # In the main process, before the workers start (they inherit the environment): one folder
    # for this test run, holding the scheduler's units and duolm's cache (tokenized corpora, the
    # converted judge), shared by the workers and removed at the end.
    if hasattr(config, "workerinput"):
        return
    scratch = Path(tempfile.mkdtemp(prefix="duolm-tests-"))
    config.duolm_scratch = scratch
    os.environ["DUOLM_TEST_SCRATCH"] = str(scratch)
    os.environ["DUOLM_CACHE"] = str(scratch / "cache")
    os.environ[scheduling.UNITS_FOLDER] = str(scratch / "units")
    (scratch / "units").mkdir()
    # Every training start measures the machine's matmul peak for its MFU (about 0.7 s of CPU;
    # hundreds of runs start in a test run): measure it once here and hand it to every run. The
    # tests of the measurement itself unset it.
    if not os.environ.get(hardware.PEAK_VARIABLE):
        peak = hardware.matmul_rate(torch.device("cpu"), torch.float32)
        os.environ[hardware.PEAK_VARIABLE] = f"{peak / 1e12:.4g}"


def pytest_unconfigure(config):
    scratch = getattr(config, "duolm_scratch", None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def pytest_xdist_make_scheduler(config, log):
    return scheduling.GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in NUMERICS_MODULES:
            item.add_marker("numerics")
    scheduling.order(items)
    scheduling.write_units(items)


@contextmanager
def _exclusive(lock_path: Path):
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fingerprint(folder: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(path.relative_to(folder)), path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*")
        if path.is_file()
    )


@pytest.fixture(scope="session")
def shared_run_dir():
    """``build(name, make)``: the folder ``name`` made once per test run by ``make(folder)``,
    by whichever worker asks first (the other waits for it), then read by every test that asks.
    The tests must not change it (one that writes into a run copies it first): at the end of
    the session every worker checks that each folder it used is as it was built."""
    root = Path(os.environ["DUOLM_TEST_SCRATCH"]) / "shared-runs"
    root.mkdir(exist_ok=True)
    used: dict[Path, list] = {}

    def build(name: str, make) -> Path:
        folder = root / name
        with _exclusive(root / f"{name}.lock"):
            if not (root / f"{name}.done").exists():
                make(folder)
                (root / f"{name}.done").write_text(json.dumps(_fingerprint(folder)))
        used[folder] = json.loads((root / f"{name}.done").read_text())
        return folder

    yield build
    for folder, built in used.items():
        now = [list(entry) for entry in _fingerprint(folder)]
        assert now == built, f"a test changed the shared run {folder.name}; copy it first"


@pytest.fixture(scope="session")
def tiny_runs(shared_run_dir) -> dict[str, Path]:
    """A tiny AR run and a tiny MDM run (5 steps, one validation at the end), trained once per
    test run for the modules that only read them."""

    def make(folder: Path) -> None:
        for objective in ("ar", "mdm"):
            cli.train_from_argv(
                ["--preset", "tiny", "--objective", objective, "--out", str(folder / objective)]
                + ["--max-steps", "5", "--eval-every", "100", "--cache-dir", str(folder / "cache")]
            )

    root = shared_run_dir("tiny-runs", make)
    return {"ar": root / "ar", "mdm": root / "mdm"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """A tokenizer cache for the runs one test module trains."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, cache_dir) -> Path:
    """A tiny MDM run of two steps, its one checkpoint in the current format (a module that
    changes it works on ``helpers.copy_of``)."""
    out = tmp_path_factory.mktemp("tiny") / "run"
    argv = ["--preset", "tiny", "--objective", "mdm", "--out", str(out)]
    cli.train_from_argv([*argv, "--cache-dir", str(cache_dir), "--max-steps", "2"])
    return out


@pytest.fixture(scope="module")
def small_sharded(tmp_path_factory, cache_dir) -> Path:
    """The last checkpoint of a tiny two-step run saved in the sharded format."""
    out = tmp_path_factory.mktemp("small") / "run"
    cli.train_from_argv(
        ["--preset", "tiny", "--max-steps", "2", "--eval-every", "2", "--out", str(out)]
        + ["--cache-dir", str(cache_dir), "--checkpoint-format", "sharded"]
    )
    return ckpt.list_checkpoints(out / "checkpoints")[-1]


@pytest.fixture
def private_home(tmp_path_factory, tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own (a folder beside its tmp_path, so the tests that list what a
    command left in tmp_path find only that) and duolm's cache in tmp_path, debug tracebacks off:
    what a command writes by default lands there, never in the user's home."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DUOLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DUOLM_DEBUG", raising=False)
    return home


@pytest.fixture(scope="module")
def byte_tok():
    """The byte-level tokenizer the synthetic languages are written in."""
    return Tokenizer.byte()


@pytest.fixture(scope="module")
def udm_run(tmp_path_factory) -> Path:
    """A tiny uniform-state diffusion run of two steps."""
    out = tmp_path_factory.mktemp("udm") / "run"
    cli.train_from_argv(
        ["--preset", "tiny", "--objective", "udm", "--out", str(out), "--max-steps", "2"]
        + ["--eval-every", "100", "--cache-dir", str(out.parent / "cache")]
    )
    return out


@pytest.fixture(scope="module")
def language():
    """The small variable-length hidden Markov language the exact samplers' tests enumerate."""
    from shared.data.synthetic.hmm import HMMLanguage

    return HMMLanguage(states=2, vocab=2, max_len=3, stop_min=0.2, stop_max=0.6, seed=4)
