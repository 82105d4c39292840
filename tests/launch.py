"""The command lines that start train.py as CPU processes over gloo under accelerate (plain DDP,
and FSDP2 through ``tests/fsdp_on_cpu.py`` on one or more localhost "nodes")."""

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port that nothing listens on now (a fixed port collides when two test runs share
    the machine)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_cpu_processes(port: int) -> list[str]:
    """``accelerate launch`` arguments up to the script (run with ``ACCELERATE_USE_CPU=1``)."""
    return [
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
    ]


ROOT = Path(__file__).resolve().parent.parent
FSDP_CONFIG = ROOT / "configs" / "accelerate" / "fsdp_1node.yaml"
# A tiny MDM run with tied weights (the awkward case for gathering and saving), checkpointed at
# step 4 of 8: what the FSDP and sharded-checkpoint tests train.
FSDP_RUN = [
    "--preset",
    "tiny",
    "--objective",
    "mdm",
    "--tie-embeddings",
    "true",
    "--max-steps",
    "8",
    "--eval-every",
    "4",
    "--log-every",
    "1",
]


def fsdp_command(out: Path, cache: Path, *extra, port: int, machines: int = 1, rank: int = 0):
    """``accelerate launch`` of ``tests/fsdp_on_cpu.py`` as two FSDP2 processes per "node" on
    this machine (``machines`` launchers, this one ``rank``, rendezvous on 127.0.0.1)."""
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    return [
        "accelerate",
        "launch",
        "--config_file",
        str(FSDP_CONFIG),
        "--num_processes",
        str(2 * machines),
        "--num_machines",
        str(machines),
        "--machine_rank",
        str(rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--mixed_precision",
        "no",
        "tests/fsdp_on_cpu.py",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        *extra,
    ]


def cpu_launch_env(**extra: str) -> dict:
    """The environment of a launch on CPU processes, one thread each."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", **extra}


def launch_fsdp(out: Path, cache: Path, *extra: str, port: int) -> str:
    """Run ``fsdp_command`` to the end (it must succeed); its output."""
    result = subprocess.run(
        fsdp_command(out, cache, *extra, port=port),
        cwd=ROOT,
        env=cpu_launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr
