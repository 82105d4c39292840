"""The one door through which duolm opens, reads, writes, moves and removes files.

Every path a user names and every file a received folder holds (a run folder, a checkpoint,
token shards, a stage file, a findings index, an export or an import) is opened here and
nowhere else; ``tests/test_door.py`` scans the source and fails on any other site that opens,
reads, writes, memory-maps, moves or unpickles a path. Whoever crafted a folder chooses every
byte and every name in it, so the door

- refuses a symbolic link in any component below the root it is given (``root``: the folder the
  user named) and on the last component always (``O_NOFOLLOW``), so a link can neither make a
  reader read a file of this machine nor make a writer empty one;
- opens without blocking and then asks the open file what it is (``fstat``): only a regular
  file is read or written; a FIFO, socket or device is refused at once, never waited on;
- keeps what it opens inside ``root`` once every link is resolved;
- bounds what it reads where a size is declared (``limit``);
- parses JSON only through ``parse_json`` (bad syntax, non-UTF-8 bytes, integers of thousands of
  digits and nesting deep enough to exhaust the recursion limit become one line naming the file);
- writes only by temporary file and rename in the same folder (``write_atomic``), or appends to
  a regular file opened without following links (``append_line``); locks open the same way.

A library that insists on a path is handed ``/proc/self/fd/N`` (``opened_path``). How a path is
judged before it is opened (links, kinds of file, staying inside a root) is in
``shared.path_checks``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shared.errors import ConfigError, with_path
from shared.path_checks import (
    components_below,
    kind_of_mode,
    not_a_regular_file,
    path_inside,
    refuse_link,
    refuse_links_below,
    refuse_links_within,
)
from shared.strict_json import parse_json

TOKENIZER_LIMIT = 1 << 30  # bytes of a tokenizer.json: the largest vocabularies take a few MB
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# ------------------------------------------------------------------------------ reading


def _opened_regular(fd: int, path: Path, what: str, error) -> int:
    """``fd`` when it is a regular file (its O_NONBLOCK cleared); otherwise closed and refused."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(
            f"{path} is {kind_of_mode(mode)}, not a regular file; {what} reads regular files only"
        )
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return fd


def open_fd(path: Path, root: Path | None = None, *, what: str = "duolm", error=ConfigError) -> int:
    """A descriptor of the regular file ``path``, opened for reading through the door (no link
    below ``root`` or at the end, never blocking, inside ``root``). A missing file raises
    FileNotFoundError as ``open`` does."""
    path = Path(path)
    refuse_links_below(path, root, what, error)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as failure:
        if failure.errno == errno.ELOOP:
            refuse_link(path, what, error)
        raise
    fd = _opened_regular(fd, path, what, error)
    # the file opened, not the name: a link swapped in after the checks above is caught here
    if root is not None and not path_inside(f"/proc/self/fd/{fd}" if _has_proc() else path, root):
        os.close(fd)
        raise error(f"{path} lies outside {root}; {what} reads only files inside its own folder")
    return fd


def open_read(
    path: Path, root: Path | None = None, *, what: str = "duolm", error=ConfigError
) -> BinaryIO:
    """``path`` opened for reading in binary through the door (``open_fd``)."""
    return os.fdopen(open_fd(path, root, what=what, error=error), "rb")


def read_bytes(
    path: Path,
    root: Path | None = None,
    *,
    limit: int | None = None,
    what: str = "duolm",
    error=ConfigError,
) -> bytes:
    """The bytes of ``path`` read through the door; more than ``limit`` bytes is refused."""
    with open_read(path, root, what=what, error=error) as handle:
        if limit is not None and os.fstat(handle.fileno()).st_size > limit:
            raise error(f"{path}: larger than the {limit:,} bytes such a file may hold")
        return handle.read()


def read_text(path: Path, root: Path | None = None, *, error=ConfigError, **door) -> str:
    """The UTF-8 text of ``path`` read through the door; bytes that are not UTF-8 are one line."""
    data = read_bytes(path, root, error=error, **door)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as reason:
        raise error(f"{path}: not UTF-8 text ({reason})") from None


def read_json_file(
    path: Path, error: type[Exception] = ConfigError, root: Path | None = None, **door
) -> Any:
    """The JSON value in ``path``, read through the door; a file that is not JSON (or not UTF-8)
    is ``error``, one line naming it. A missing file raises FileNotFoundError as ``open`` does."""
    try:
        text = read_bytes(path, root, error=error, **door).decode("utf-8")
    except UnicodeDecodeError as reason:
        raise error(f"{path}: not JSON (not UTF-8 text: {reason})") from None
    return parse_json(text, str(path), error)


def read_json_object(
    path: Path, error: type[Exception] = ConfigError, root: Path | None = None, **door
) -> dict[str, Any]:
    """``read_json_file`` of a file that must hold a JSON object."""
    value = read_json_file(path, error, root, **door)
    if not isinstance(value, dict):
        raise error(f"{path}: holds a JSON {type(value).__name__}, not an object")
    return value


@contextlib.contextmanager
def opened_path(
    path: Path, root: Path | None = None, *, what: str = "duolm", error=ConfigError
) -> Iterator[str]:
    """A name for a library that insists on one (safetensors, tokenizers, numpy): the file the
    door opened, as ``/proc/self/fd/N``, so the library reads the file that was checked even if
    the path is swapped for a link meanwhile. Without /proc: the checked path itself."""
    fd = open_fd(path, root, what=what, error=error)
    try:
        yield f"/proc/self/fd/{fd}" if _has_proc() else str(path)
    finally:
        os.close(fd)


def checked_name(
    path: Path, root: Path | None = None, *, what: str = "duolm", error=ConfigError
) -> str:
    """The name of ``path`` once the door has opened and checked it, for a library that keeps
    its own handle past this call (safetensors' memory maps over an import's shards)."""
    os.close(open_fd(path, root, what=what, error=error))
    return str(path)


def memmap(path: Path, dtype, root: Path | None = None, *, what="duolm", error=ConfigError):
    """A read-only NumPy memory map of the regular file ``path``, opened through the door."""
    # the map keeps its own descriptor, so the name is checked and the map made on it at once
    return np.memmap(checked_name(path, root, what=what, error=error), dtype=dtype, mode="r")


# ------------------------------------------------------------------------------ writing


def _has_proc() -> bool:
    return os.path.isdir("/proc/self/fd")


def current_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


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
    path: Path,
    data: bytes | str | Callable[[BinaryIO], None],
    *,
    durable: bool = False,
    root: Path | None = None,
) -> None:
    """Replace ``path`` with ``data`` (bytes, text as UTF-8, or a function that writes to the
    open file) in one rename. ``durable`` also fsyncs the file before the rename, for records
    that must survive a power cut together with what they describe (checkpoints). Only a
    regular file or a new path is replaced, and no link below ``root`` is followed."""
    path = Path(path)
    refuse_links_below(path.parent, root, "an output folder")
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


def make_folders(path: Path, root: Path) -> Path:
    """Make ``path`` and the folders between ``root`` and it, one component at a time, never
    through a symbolic link: ``mkdir(parents=True)`` would follow a link below ``root`` and make
    (and later fill) folders outside it. A component that is a link, or not a folder, is
    refused in one line; ``root`` itself is the folder the user named, made if missing."""
    path, root = Path(path), Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for component in components_below(path, root):
        try:
            mode = os.lstat(component).st_mode
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):  # made meanwhile: judged below
                os.mkdir(component)
            mode = os.lstat(component).st_mode
        if stat.S_ISLNK(mode):
            refuse_link(component, f"the folder {root}")
        if not stat.S_ISDIR(mode):
            raise ConfigError(
                f"{component} is {kind_of_mode(mode)}, not a folder; {root} holds its own "
                "folders there: move it away, or use another folder"
            )
    return path


def write_json_atomic(
    path: Path, data: Any, *, durable: bool = True, root: Path | None = None, **dumps: Any
) -> None:
    """``data`` as indented JSON, written atomically (and durably unless asked otherwise)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, **dumps), durable=durable, root=root)


def _open_regular_for_writing(path: Path, flags: int, what: str) -> int:
    """``path`` opened with ``flags`` (plus no link followed, never blocking); only a regular
    file (or a new one) is kept open."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as failure:
        if failure.errno == errno.ELOOP:
            refuse_link(path, what)
        if failure.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
            raise ConfigError(
                f"{path} is a FIFO (named pipe), not a regular file; {what} writes regular "
                "files only"
            ) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigError(
            f"{path} is {kind_of_mode(mode)}, not a regular file; {what} writes regular files only"
        )
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def append_line(path: Path, line: str, *, root: Path | None = None) -> None:
    """Add ``line`` and a newline to the end of ``path`` whole or not at all: a write the disk
    cuts short (full, over quota) is cut off again, so the file never ends in half a record
    that its readers would fail on. A link (below ``root`` or at the end) is refused, never
    written through. (Unbuffered, so that closing the file has nothing left to write.)"""
    path = Path(path)
    refuse_links_below(path, root, "a run folder")
    data = (line + "\n").encode("utf-8")
    fd = _open_regular_for_writing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "a run folder")
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


def open_lock_file(path: Path, *, create: bool = True):
    """A lock file opened for reading and writing (text), created when missing: never through a
    link, never a FIFO or device (refused at once rather than waited on)."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    return os.fdopen(_open_regular_for_writing(Path(path), flags, "a lock"), "r+")


def open_new_file(path: Path) -> BinaryIO:
    """``path`` created for writing in binary; it must not exist (a staged file inside a folder
    this command made), so nothing is ever written through a link or over another file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, "wb")


def write_new_file(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Create ``path`` (``open_new_file``) and let ``write`` fill it, then fsync it."""
    with open_new_file(path) as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def copy_file(source: Path, target: Path, root: Path | None = None) -> None:
    """Copy the regular file ``source`` (read through the door) to the new path ``target``."""
    with open_read(source, root) as reading:
        write_new_file(target, lambda handle: shutil.copyfileobj(reading, handle))


def copy_tree(source: Path, target: Path, root: Path | None = None) -> None:
    """Copy the folder ``source`` to the new folder ``target``: regular files and folders only,
    no link followed or copied."""
    refuse_links_within(source, "a folder being copied")
    target.mkdir()
    for entry in sorted(Path(source).iterdir()):
        (copy_tree if entry.is_dir() else copy_file)(entry, target / entry.name, root)


# ------------------------------------------------------------------------------ moving


def rename(source: Path, target: Path) -> None:
    """Move ``source`` to ``target`` in one rename (same file system): what duolm staged into
    place, or an entry of a folder it made moved aside. A rename moves a link itself, never
    what it points to, and never writes through a link at ``target`` (it replaces the link)."""
    os.rename(source, target)


def replace(source: Path, target: Path) -> None:
    """``rename`` over an existing regular file ``target`` (never a link or special file)."""
    check_output_file(Path(target))
    os.replace(source, target)


def remove_file(path: Path) -> None:
    """Remove the file (or link: the link itself, never its target) at ``path``, if any."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_tree(path: Path) -> None:
    """Remove the folder ``path`` duolm made (staging, an old checkpoint); links in it are
    removed, never followed, as is a link in place of the folder."""
    if os.path.islink(path):
        remove_file(path)
        return
    shutil.rmtree(path, ignore_errors=True)


def make_temp_folder(parent: Path, prefix: str) -> Path:
    """A new folder in ``parent`` with a name no other folder has (made atomically)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def make_temp_file(parent: Path, prefix: str, suffix: str = "") -> tuple[int, Path]:
    """A new private file in ``parent``: its descriptor and path."""
    return (made := tempfile.mkstemp(dir=parent, prefix=prefix, suffix=suffix))[0], Path(made[1])


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    _fsync(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file under ``root`` (links are not followed), then ``root`` itself."""
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and not path.is_symlink():
            _fsync(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
    fsync_dir(root)
