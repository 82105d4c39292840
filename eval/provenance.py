"""Where a result came from: the code that made it (git commit, whether the tree differed from
it, a hash of the project's source that holds outside a git checkout too), the machine, the
library versions, the seeds and the time. Every report records it; findings compare it with
their registration. The code's part is ``shared.code_state``'s, which training records too."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from datetime import UTC, datetime
from typing import Any

import torch

from shared.code_state import PROJECT_ROOT, code_state, git_output, source_hash
from shared.hardware import cpu_name

__all__ = ["PROJECT_ROOT", "code_state", "git_output", "provenance", "source_hash"]


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
