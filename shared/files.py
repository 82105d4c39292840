"""Where duolm keeps what it can rebuild, and the modes of what it writes. Opening, reading,
writing and moving files happens in ``shared.door``."""

from __future__ import annotations

import os
from pathlib import Path

from shared.door import current_umask


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


def follow_umask(root: Path) -> None:
    """Give ``root`` and everything under it the modes a plain ``open``/``mkdir`` would have had
    (``tempfile`` creates private 0600 files and 0700 folders, which is wrong for results the
    user shares). Links are left alone (chmod would follow them out of ``root``)."""
    mask = current_umask()
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
