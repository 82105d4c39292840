"""Files written so that a reader never sees half of one: write beside, then rename."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from shared.errors import ConfigError, with_path


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


def current_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


def follow_umask(root: Path) -> None:
    """Give ``root`` and everything under it the modes a plain ``open``/``mkdir`` would have had
    (``tempfile`` creates private 0600 files and 0700 folders, which is wrong for results the
    user shares)."""
    mask = current_umask()
    for path in [root, *root.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


# What a path that is not a regular file is, by its lstat mode (a final link is not followed).
_SPECIAL_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_regular_file(path: Path) -> str | None:
    """What ``path`` is when something other than a regular file is there (a device, a FIFO, a
    socket, a folder, a symbolic link), in words; None for a regular file or a new path."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    for test, kind in _SPECIAL_KINDS:
        if test(mode):
            return f"{kind} to {os.readlink(path)}" if kind == "a symbolic link" else kind
    return "not a regular file"


def check_output_file(path: Path, what: str = "") -> Path:
    """Refuse an output file path that names anything but a regular file or a new path: an
    atomic write renames a new file over the path, which would replace a device node (as root,
    /dev/null itself), a FIFO or a socket, and would put a file where a symbolic link was."""
    kind = not_a_regular_file(Path(path))
    if kind:
        name = f"{what} {path}" if what else str(path)
        raise ConfigError(
            f"{name} is {kind}, not a regular file; outputs are written only to regular files "
            "or new paths: name a new file"
        )
    return Path(path)


def write_atomic(
    path: Path, data: bytes | str | Callable[[BinaryIO], None], *, durable: bool = False
) -> None:
    """Replace ``path`` with ``data`` (bytes, text as UTF-8, or a function that writes to the
    open file) in one rename. ``durable`` also fsyncs the file before the rename, for records
    that must survive a power cut together with what they describe (checkpoints). Only a
    regular file or a new path is replaced (``check_output_file``)."""
    check_output_file(path)
    # The temporary file lives in the same folder so os.replace is a same-filesystem rename.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            if callable(data):
                data(handle)
            else:
                handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        named = with_path(error, path)  # a write to the open file names no path
        if named is error:
            raise
        raise named from error


def write_json_atomic(path: Path, data: Any, *, durable: bool = True, **dumps: Any) -> None:
    """``data`` as indented JSON, written atomically (and durably unless asked otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, **dumps), durable=durable)


def append_line(path: Path, line: str) -> None:
    """Add ``line`` and a newline to the end of ``path`` whole or not at all: a write the disk
    cuts short (full, over quota) is cut off again, so the file never ends in half a record
    that its readers would fail on. (Unbuffered, so that closing the file has nothing left to
    write after a failure.)"""
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError as error:
            os.ftruncate(fd, end)
            raise with_path(error, path) from error
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then ``root`` itself."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fsync_dir(root)
