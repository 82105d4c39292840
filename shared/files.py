"""Where duolm keeps what it can rebuild (its cache root and folders), and how long a path it
can write into. Opening, reading, writing and moving files happens in ``shared.door``."""

from __future__ import annotations

import os
from pathlib import Path

from shared.errors import ConfigError

# What a file system takes when it cannot be asked (POSIX's NAME_MAX and Linux's PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4096
# Room kept below the longest path for the files a command writes inside the folder it was
# given (``checkpoints/.step_000004.x1y2z3/optimizer.safetensors`` and the like).
INNER_PATH_ROOM = 128


def cache_root() -> Path:
    """Where duolm keeps what it can rebuild (tokenized corpora, the converted judge):
    ``$DUOLM_CACHE``, else ``~/.cache/duolm``."""
    return Path(os.environ.get("DUOLM_CACHE", Path.home() / ".cache" / "duolm"))


def cache_folder(typed: str | os.PathLike[str] | None) -> Path:
    """Where a command writes tokenized corpora: the ``--cache-dir`` typed, else the user's
    default (``cache_root``). Never the ``cache_dir`` a run recorded in its state.json: a run
    folder may come from someone else, and its settings must not choose where this machine
    writes."""
    return Path(typed) if typed else cache_root()


def use_cache_root(typed: str | os.PathLike[str] | None) -> None:
    """Make a typed ``--cache-dir`` this process's cache root (``$DUOLM_CACHE``), for an
    experiment whose stages load rows of runs it trains: those readers take the user's cache
    root, never a folder a run's record names, and the measuring processes it spawns inherit
    the setting. Nothing typed: nothing changes."""
    if typed:
        os.environ["DUOLM_CACHE"] = str(Path(typed).expanduser().resolve())


def check_path_length(path: Path, what: str) -> Path:
    """Refuse ``path`` (a folder a command writes into, ``what`` naming its flag) when one of its
    names is longer than its file system takes, or when it leaves less than ``INNER_PATH_ROOM``
    bytes below the longest path for the files written inside it. The system's answer to
    either (ENAMETOOLONG) would otherwise come from the middle of the work."""
    path = Path(path)
    name_max, path_max = _name_limits(path.absolute())
    shown = str(path) if len(str(path)) <= 60 else f"{str(path)[:40]}... ({len(str(path))} chars)"
    for name in path.parts:
        if len(os.fsencode(name)) > name_max:
            raise ConfigError(
                f"{what} {shown}: the name {name[:20]}... is {len(os.fsencode(name))} bytes "
                f"long; this file system takes names of at most {name_max} bytes"
            )
    length = len(os.fsencode(path.absolute()))
    if length + INNER_PATH_ROOM > path_max:
        raise ConfigError(
            f"{what} {shown}: a path of {length} bytes leaves no room for the files written "
            f"inside it (paths here end at {path_max} bytes); choose a shorter path"
        )
    return path


def _name_limits(path: Path) -> tuple[int, int]:
    """(longest name, longest path) of the file system that holds the nearest existing folder
    above ``path``; the usual limits where it cannot say."""
    for folder in [path, *path.parents]:
        try:
            if folder.is_dir():
                return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
        except (OSError, ValueError):
            continue
    return NAME_MAX, PATH_MAX
