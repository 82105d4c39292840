"""The project's own code as this process ran it: each source file's hash as first read, the
git commit and whether the tree differed from it, and a hash of the whole source.

Training records it per run (``shared.training.provenance``), the stage cache keys stages by
it (``eval.stage_key``) and every report states its own (``eval.provenance``). It lives in
``shared`` because training, the lowest layer that needs it, may not import ``eval``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The project's top-level folders whose modules a process may execute (bench/ helpers included).
STAGE_FOLDERS = ("arlm", "dllm", "shared", "eval", "bench")
# The packages whose source makes up ``source_hash``.
SOURCE_PACKAGES = ("arlm", "dllm", "shared", "eval")


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


def code_key(code: dict[str, str]) -> str:
    """One short name for a map of file -> hash (``stage_code``): equal maps, equal keys."""
    text = "\n".join(f"{path} {digest}" for path, digest in sorted(code.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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


def git_state(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The commit checked out and whether the tree differed from it (a changed tracked file, or
    an untracked file git does not ignore, such as a new module a finding imports: the commit
    alone does not name the code); None for each outside a git checkout."""
    status = git_output("status", "--porcelain", cwd=root)
    return {
        "git_commit": git_output("rev-parse", "HEAD", cwd=root) or None,
        "git_dirty": None if status is None else bool(status),
    }


def code_state(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The code that made a result: its commit, whether the tree differed from it, and the
    source hash."""
    return git_state(root) | {"source_hash": source_hash(root)}
