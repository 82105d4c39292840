"""Where duolm keeps what it can rebuild (its cache root and folders). Opening, reading,
writing and moving files happens in ``shared.door``."""

from __future__ import annotations

import os
from pathlib import Path


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
