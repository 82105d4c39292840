"""One thread per test process: the machine is shared and two OpenMP threads can stall badly."""

import os
import sys
from pathlib import Path

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


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in NUMERICS_MODULES:
            item.add_marker("numerics")
