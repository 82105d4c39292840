"""Where a result came from: the code that made it (git commit, whether the tree differed from
it, a hash of the project's source that holds outside a git checkout too), the machine, the
library versions, the seeds and the time. Every report records it; findings compare it with
their registration."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from shared.hardware import cpu_name

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SOURCE_PACKAGES = ("arlm", "dllm", "shared", "eval")


def source_hash(root: Path = PROJECT_ROOT) -> str:
    """A hash of the project's Python source (the packages and ``train.py``), so a result can
    tell the code that made it apart from today's even outside a git checkout."""
    digest = hashlib.sha256()
    files = [root / "train.py"] + sorted(
        path for package in SOURCE_PACKAGES for path in (root / package).rglob("*.py")
    )
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def git_output(*args: str, cwd: Path = PROJECT_ROOT, timeout: float = 5) -> str | None:
    """git's output in ``cwd``, stripped; None when git is missing, there is no checkout, or
    the command fails (``merge-base --is-ancestor`` fails for "not an ancestor")."""
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_state(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The code that made a result: its commit, whether the tree differed from it (a changed
    tracked file, or an untracked file git does not ignore, such as a new module a finding
    imports: the commit alone does not name the code), and the source hash."""
    status = git_output("status", "--porcelain", cwd=root)
    return {
        "git_commit": git_output("rev-parse", "HEAD", cwd=root) or None,
        "git_dirty": None if status is None else bool(status),
        "source_hash": source_hash(root),
    }


def provenance(seeds: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where the numbers came from: code version, machine, library versions, seeds, time."""

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    cpu = cpu_name()
    return {
        **code_state(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu,
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "platform": platform.platform(),
        },
        "versions": {
            "python": platform.python_version(),
            **{
                p: version(p)
                for p in (
                    "torch",
                    "transformers",
                    "accelerate",
                    "datasets",
                    "tokenizers",
                    "mauve-text",
                    "numpy",
                )
            },
        },
        "seeds": seeds or {},
    }
