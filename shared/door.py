"""The one door through which duolm opens, reads, writes, moves and removes files.

Every path a user names and every file a received folder holds (a run folder, a checkpoint,
token shards, a stage file, a findings index, an export or an import) is opened here and
nowhere else; ``tests/test_door.py`` scans the source and fails on any other site that opens,
reads, writes, memory-maps, moves or unpickles a path, and ``tests/test_file_audit.py`` runs every
command under an audit of file events and fails on any event in a user's folder that the door
did not perform. Whoever crafted a folder chooses every byte and every name in it, so the door

- walks every path below a root (the folder the user named, given as ``root`` or declared by
  the command with ``declare_root``) one folder at a time from the root's descriptor
  (``shared.door_walk``): a symbolic link in any folder below the root is refused, never
  followed, as is a ``..`` below it; the last name is opened, made, renamed or removed
  relative to its folder's descriptor, never through a link (``O_NOFOLLOW``);
- opens without blocking and then asks the open file what it is (``fstat``): only a regular
  file is read or written; a FIFO, socket or device is refused at once, never waited on;
- reads at most ``limit`` bytes (a default that a caller raises on purpose), counting what it
  reads rather than trusting a size read before;
- parses JSON only through ``parse_json`` (``shared.strict_json``);
- writes only by a new file and a rename in the same folder (``write_atomic``); writes in place
  (an append, a lock record) only to a file no other name shares: a hard link is broken first
  by a copy renamed over this name, so the other name never changes;
- makes folders only through ``make_folders`` (each one below the root by descriptor).

A library that insists on a path is handed ``/proc/self/fd/N`` (``opened_path``); a library
that is handed a folder, or writes one by name, gets a private staging folder
(``shared.door_staging``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shared.door_walk import (
    NEW_FILE_FLAGS,
    declare_root,
    door_operation,
    each_file_below,
    fill_file,
    forget_declared_roots,
    new_file_in,
    open_at,
    open_folder,
    opened_regular,
    parent_of,
    refuse_special_at,
    unshare,
)
from shared.errors import ConfigError, with_path
from shared.path_checks import not_a_regular_file, not_an_output_file, refuse_links_within
from shared.strict_json import parse_json

__all__ = ["declare_root", "forget_declared_roots"]

TOKENIZER_LIMIT = 1 << 30  # bytes of a tokenizer.json: the largest vocabularies take a few MB
READ_LIMIT = 1 << 28  # bytes any one read takes unless its caller allows more, on purpose
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# ------------------------------------------------------------------------------ reading


@door_operation
def open_fd(path: Path, root: Path | None = None, *, what: str = "duolm", error=ConfigError) -> int:
    """A descriptor of the regular file ``path``, opened for reading through the door (walked
    from ``root``, no link followed, never blocking). A missing file raises FileNotFoundError as
    ``open`` does."""
    path = Path(path)
    with parent_of(path, root, what=what, error=error) as (folder, name):
        fd = open_at(folder, name, _READ_FLAGS, path, what, error)
    return opened_regular(fd, path, what, error)


def open_read(
    path: Path, root: Path | None = None, *, what: str = "duolm", error=ConfigError
) -> BinaryIO:
    """``path`` opened for reading in binary through the door (``open_fd``)."""
    return os.fdopen(open_fd(path, root, what=what, error=error), "rb")


def read_bytes(
    path: Path,
    root: Path | None = None,
    *,
    limit: int = READ_LIMIT,
    what: str = "duolm",
    error=ConfigError,
) -> bytes:
    """The bytes of ``path`` read through the door; more than ``limit`` bytes is refused (at
    most ``limit + 1`` are read, whatever size the file claims or grows to meanwhile)."""
    with open_read(path, root, what=what, error=error) as handle:
        # the size the file claims sizes the first read; growth since is read too, to the limit
        data = handle.read(min(os.fstat(handle.fileno()).st_size, limit) + 1)
        while len(data) <= limit and (more := handle.read(min(1 << 20, limit + 1 - len(data)))):
            data += more
    if len(data) > limit:
        raise error(f"{path}: larger than the {limit:,} bytes such a file may hold")
    return data


def read_text(path: Path, root: Path | None = None, *, error=ConfigError, **door) -> str:
    """The UTF-8 text of ``path`` read through the door; bytes that are not UTF-8 are one line."""
    data = read_bytes(path, root, error=error, **door)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as reason:
        raise error(f"{path}: not UTF-8 text ({reason})") from None


def read_json_file(
    path: Path,
    error: type[Exception] = ConfigError,
    root: Path | None = None,
    *,
    allow_nan: bool = False,
    **door,
) -> Any:
    """The JSON value in ``path``, read through the door; a file that is not strict JSON
    (``shared.strict_json``) is ``error``, one line naming it. ``allow_nan``: the project's own
    measurement records, which spell a missing number NaN. A missing file raises
    FileNotFoundError as ``open`` does."""
    data = read_bytes(path, root, error=error, **door)
    return parse_json(data, str(path), error, allow_nan=allow_nan)


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
    """A read-only NumPy memory map of the regular file ``path``, made on the file the door
    opened (the map keeps its own duplicate of the descriptor; the name is not opened again)."""
    with open_read(path, root, what=what, error=error) as handle:
        mapped = np.memmap(handle, dtype=dtype, mode="r")
    mapped.filename = os.path.abspath(path)  # what it maps, for messages (not opened again)
    return mapped


# ------------------------------------------------------------------------------ folders


def _has_proc() -> bool:
    return os.path.isdir("/proc/self/fd")


def current_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


@door_operation
def make_folders(folder: Path, root: Path | None = None, *, what: str = "an output folder") -> Path:
    """Make ``folder`` and any missing folder above it, below ``root`` (or a declared root) one
    at a time by descriptor, so a link in its place is refused rather than followed."""
    with open_folder(Path(folder), root, make=True, what=what):
        return Path(folder)


@door_operation
def make_temp_folder(parent: Path, prefix: str, *, private: bool = True) -> Path:
    """A new folder in ``parent`` with a name no other folder has (made atomically): private
    (0700) for staging, else with the umask's mode as ``mkdir`` gives (a folder kept)."""
    with open_folder(Path(parent), make=True) as folder:
        while True:
            name = f"{prefix}{secrets.token_hex(4)}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700 if private else 0o777, dir_fd=folder)
                return Path(parent) / name


@door_operation
def remove_empty_folder(folder: Path) -> None:
    """Remove the folder ``folder`` when it is empty; OSError (ENOTEMPTY) when it is not."""
    with parent_of(Path(folder)) as (parent, name):
        os.rmdir(name, dir_fd=parent)


@door_operation
def follow_umask(root: Path) -> None:
    """Give ``root`` and everything under it the modes a plain ``open``/``mkdir`` would have had
    (staging folders and some libraries make private 0600 files and 0700 folders, wrong for
    results the user shares). Each file is changed through its own descriptor, so a link is
    never followed out of ``root``."""
    mask = current_umask()
    with open_folder(Path(root)) as top:
        each_file_below(top, lambda fd: os.fchmod(fd, 0o666 & ~mask))
        for _, _, _, folder in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            os.fchmod(folder, 0o777 & ~mask)


@door_operation
def make_temp_file(parent: Path, prefix: str, suffix: str = "") -> tuple[int, Path]:
    """A new private file in ``parent``: its descriptor (open for writing) and path."""
    with open_folder(Path(parent)) as folder:
        while True:
            name = f"{prefix}{secrets.token_hex(4)}{suffix}"
            with contextlib.suppress(FileExistsError):
                return os.open(name, NEW_FILE_FLAGS, 0o600, dir_fd=folder), Path(parent) / name


@door_operation
def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    with open_folder(Path(path)) as folder:
        os.fsync(folder)


@door_operation
def fsync_tree(root: Path) -> None:
    """fsync every regular file under ``root`` (links are not followed), then ``root`` itself."""
    with open_folder(Path(root)) as top:
        each_file_below(top, os.fsync)
        os.fsync(top)


# ------------------------------------------------------------------------------ writing


def check_output_file(path: Path, what: str = "") -> Path:
    """Refuse an output file path that names anything but a regular file or a new path: an
    atomic write renames a new file over the path, which would replace a device node (as root,
    /dev/null itself), a FIFO or a socket, and would put a file where a symbolic link was."""
    kind = not_a_regular_file(Path(path))
    if kind:
        raise not_an_output_file(f"{what} {path}" if what else path, kind)
    return Path(path)


@door_operation
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
    regular file or a new path is replaced, and no link below ``root`` is followed. The file
    takes the umask's permissions, as a file made by ``open`` would."""
    path = Path(path)
    with parent_of(path, root, what="an output folder") as (folder, name):
        refuse_special_at(folder, name, path)
        fd, temporary = new_file_in(folder, name)
        try:
            fill_file(fd, data, durable)
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException as error:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder)
            named = with_path(error, path)  # a write to the open file names no path
            if named is error:
                raise
            raise named from error


def write_json_atomic(
    path: Path, data: Any, *, durable: bool = True, root: Path | None = None, **dumps: Any
) -> None:
    """``data`` as indented JSON, written atomically (and durably unless asked otherwise) into
    ``path``'s folder, made first when missing."""
    make_folders(Path(path).parent, root)
    write_atomic(path, json.dumps(data, indent=2, **dumps), durable=durable, root=root)


@door_operation
def _open_for_writing(path: Path, flags: int, what: str, root: Path | None, locked=False) -> int:
    """``path`` opened with ``flags`` (no link followed, never blocking), a regular file that no
    other name shares (``unshare``)."""
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with parent_of(path, root, what=what) as (folder, name):
        for _ in range(8):  # a hard link made again between the copy and the reopen
            fd = opened_regular(
                open_at(folder, name, flags, path, what, ConfigError),
                path,
                what,
                ConfigError,
                "writes",
            )
            if os.fstat(fd).st_nlink <= 1:
                return fd
            try:
                if not unshare(folder, name, fd, locked):
                    return os.dup(fd)  # a lock held elsewhere: the caller's flock says so
            finally:
                os.close(fd)
    raise ConfigError(f"{path} keeps being linked to another name; {what} writes it only alone")


def append_line(path: Path, line: str, *, root: Path | None = None) -> None:
    """Add ``line`` and a newline to the end of ``path`` whole or not at all: a write the disk
    cuts short (full, over quota) is cut off again, so the file never ends in half a record
    that its readers would fail on. A link (below ``root`` or at the end) is refused, never
    written through; a file with other names is first given its own (``unshare``)."""
    path = Path(path)
    data = (line + "\n").encode("utf-8")
    fd = _open_for_writing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "a run folder", root)
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


def open_lock_file(path: Path, *, create: bool = True, root: Path | None = None):
    """A lock file opened for reading and writing (text), created when missing: never through a
    link, never a FIFO or device (refused at once rather than waited on), never a file that
    another name shares (its other names keep their record)."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    return os.fdopen(_open_for_writing(Path(path), flags, "a lock", root, locked=True), "r+")


def rewrite_lock_record(handle, record: str) -> None:
    """Replace the record in a lock file ``open_lock_file`` opened (a file of its own name
    only) with ``record``; an empty record is a released lock."""
    handle.seek(0)
    handle.truncate()
    handle.write(record)
    handle.flush()


@door_operation
def open_new_file(path: Path, root: Path | None = None) -> BinaryIO:
    """``path`` created for writing in binary; it must not exist (a staged file inside a folder
    this command made), so nothing is ever written through a link or over another file."""
    with parent_of(Path(path), root, what="an output folder") as (folder, name):
        return os.fdopen(os.open(name, NEW_FILE_FLAGS, 0o666, dir_fd=folder), "wb")


def write_new_file(path: Path, write: Callable[[BinaryIO], None], root: Path | None = None) -> None:
    """Create ``path`` (``open_new_file``) and let ``write`` fill it, then fsync it."""
    with open_new_file(path, root) as handle:
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
    _make_new_folder(Path(target))
    for entry in sorted(Path(source).iterdir()):
        (copy_tree if entry.is_dir() else copy_file)(entry, target / entry.name, root)


@door_operation
def _make_new_folder(folder: Path) -> None:
    with parent_of(folder, make=True, what="an output folder") as (parent, name):
        os.mkdir(name, 0o777, dir_fd=parent)


# ------------------------------------------------------------------------------ moving


@door_operation
def rename(source: Path, target: Path) -> None:
    """Move ``source`` to ``target`` in one rename (same file system): what duolm staged into
    place, or an entry of a folder it made moved aside. A rename moves a link itself, never
    what it points to, and never writes through a link at ``target`` (it replaces the link)."""
    with parent_of(Path(source)) as (source_folder, source_name):
        with parent_of(Path(target)) as (target_folder, target_name):
            os.rename(source_name, target_name, src_dir_fd=source_folder, dst_dir_fd=target_folder)


def replace(source: Path, target: Path) -> None:
    """``rename`` over an existing regular file ``target`` (never a link or special file)."""
    check_output_file(Path(target))
    rename(source, target)


@door_operation
def remove_file(path: Path) -> None:
    """Remove the file (or link: the link itself, never its target) at ``path``, if any."""
    with contextlib.suppress(FileNotFoundError), parent_of(Path(path)) as (folder, name):
        os.unlink(name, dir_fd=folder)


@door_operation
def remove_tree(path: Path) -> None:
    """Remove the folder ``path`` duolm made (staging, an old checkpoint); links in it are
    removed, never followed, as is a link in place of the folder."""
    with contextlib.suppress(FileNotFoundError), parent_of(Path(path)) as (folder, name):
        try:
            mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            shutil.rmtree(name, ignore_errors=True, dir_fd=folder)
        else:
            os.unlink(name, dir_fd=folder)
