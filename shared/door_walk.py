"""Paths walked by descriptor: how ``shared.door`` reaches a name below a folder the user named
without following a link, climbing out with ``..`` or trusting a name twice.

A path below a root is reached one component at a time from the root's open folder: each folder
is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, so a symbolic
link anywhere below the root is refused rather than followed, and a ``..`` below the root is
refused before anything opens. The root itself is the user's to name (it may be reached through
links of theirs: ``/tmp`` is one on some systems). The walk ends at the folder that holds the
last name; the door then opens, creates, renames or removes that name relative to the folder's
descriptor, so a folder swapped for a link after the walk is never followed either.

Roots come from two places: a door call's ``root=`` argument, and the folders a command declares
(``declare_root``): the run, job, export, import, shard and findings folders it was given. A path
below a declared root is walked from it even when the call names no root.

Everything the door does happens inside ``performing()``, which a runtime audit of file events
(``tests/audit.py``) reads to tell the door's own opens, folders and renames from any other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from shared.errors import ConfigError, with_path
from shared.path_checks import kind_of_mode, not_an_output_file

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_declared_roots: list[str] = []
_state = threading.local()


# ------------------------------------------------------------------------------ whose event


@contextlib.contextmanager
def performing() -> Iterator[None]:
    """Mark the file events of this block as the door's own (for the audit of file events)."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def door_operation(function):
    """Run ``function`` as one of the door's operations (``door_walk.performing``)."""

    def performed(*args, **kwargs):
        with performing():
            return function(*args, **kwargs)

    performed.__name__, performed.__doc__ = function.__name__, function.__doc__
    performed.__wrapped__ = function
    return performed


def door_is_performing() -> bool:
    """Whether the calling thread is inside one of the door's operations."""
    return getattr(_state, "depth", 0) > 0


# ------------------------------------------------------------------------------ roots


def declare_root(folder: Path) -> None:
    """Walk every later path below ``folder`` from it by descriptor, whatever the call names as
    its root: ``folder`` is one the user gave this command (its run, job or output folder)."""
    top = os.path.abspath(folder)
    if top not in _declared_roots:
        _declared_roots.append(top)


def forget_declared_roots() -> None:
    """Drop every declared root (a process that runs several commands, such as a test)."""
    _declared_roots.clear()


def root_for(path: Path, root: Path | None) -> Path | None:
    """The root ``path`` is walked from: the call's own, else the innermost declared root that
    holds ``path`` by name, else None (the path's folder is the user's, opened as named)."""
    if root is not None:
        return Path(root)
    absolute = os.path.abspath(path)
    holding = [top for top in _declared_roots if _holds(top, absolute)]
    return Path(max(holding, key=len)) if holding else None


def _holds(top: str, absolute: str) -> bool:
    return absolute != top and (absolute + os.sep).startswith(top.rstrip(os.sep) + os.sep)


def split_at_root(path: Path, root: Path, error=ConfigError) -> tuple[str, list[str]]:
    """(the root as ``path`` spells it, the names below it). ``path`` is taken as written, so a
    ``..`` below the root, which the kernel would resolve through whatever link precedes it, is
    refused rather than judged by its letters; so is a path outside the root."""
    top = os.path.abspath(root)
    written = Path(path) if Path(path).is_absolute() else Path.cwd() / path
    parts = written.parts  # pathlib keeps '..' as written
    for count in range(1, len(parts) + 1):  # the shortest spelling of the root comes first
        if os.path.normpath(os.path.join(*parts[:count])) == top:
            below = list(parts[count:])
            if ".." in below:
                raise error(
                    f"{path} climbs out with '..' below {root}; name the file inside {root} "
                    "without '..'"
                )
            return os.path.join(*parts[:count]), below
    raise error(f"{path} lies outside {root}; only files inside {root} are read or written")


# ------------------------------------------------------------------------------ the walk


def refuse_link_at(folder_fd: int, name: str, shown: Path, what: str, error=ConfigError) -> None:
    """Refuse ``name`` in the open folder when it is a symbolic link (``shown``: its path)."""
    try:
        mode = os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        target = os.readlink(name, dir_fd=folder_fd)
        raise error(
            f"{shown} is a symbolic link (to {target}); {what} holds its own files, never "
            "links: copy the files in place of the link"
        )


def step_into(parent_fd: int, name: str, shown: Path, *, make: bool, what: str, error) -> int:
    """The descriptor of the folder ``name`` in the open folder ``parent_fd`` (made when
    missing and ``make``), never through a link. ``parent_fd`` is closed."""
    try:
        try:
            return os.open(name, FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
        except FileNotFoundError:
            if not make:
                missing = os.strerror(errno.ENOENT)
                raise FileNotFoundError(errno.ENOENT, missing, str(shown)) from None
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                os.mkdir(name, 0o777, dir_fd=parent_fd)
            return os.open(name, FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
        except NotADirectoryError:  # a link, opened with O_NOFOLLOW, or a file
            refuse_link_at(parent_fd, name, shown, what, error)
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            raise error(
                f"{shown} is {kind_of_mode(mode)}, not a folder; {what} holds its own folders "
                "there: move it away, or use another folder"
            ) from None
    finally:
        os.close(parent_fd)


@contextlib.contextmanager
def parent_of(
    path: Path,
    root: Path | None = None,
    *,
    make: bool = False,
    what: str = "duolm",
    error=ConfigError,
) -> Iterator[tuple[int, str]]:
    """(the open folder that holds ``path``, ``path``'s last name). Below a root every folder
    is walked by descriptor (``make``: missing ones are made); with no root the folder is
    opened as the user named it. ``path`` must name something in a folder, not ``.`` or
    ``..``. The descriptor is closed when the block ends."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise error(f"{path} names no file in a folder; name the file itself")
    top = root_for(path, root)
    if top is not None and os.path.abspath(path) == os.path.abspath(top):
        top = None  # the root itself: its folder is the user's, as named
    if top is None:
        folder = str(path.parent)
        if make:
            make_folder_as_named(path.parent)
        fd = os.open(folder, FOLDER_FLAGS)
    else:
        spelled, below = split_at_root(path, top, error)
        if make:
            make_folder_as_named(Path(spelled))  # the root itself is the user's, as named
        fd = os.open(spelled, FOLDER_FLAGS)
        here = Path(spelled)
        for name in below[:-1]:
            here = here / name
            fd = step_into(fd, name, here, make=make, what=what, error=error)
    try:
        yield fd, path.name
    finally:
        os.close(fd)


def make_folder_as_named(folder: Path) -> None:
    """Make ``folder`` and its missing parents as the user named them (no root above it)."""
    os.makedirs(folder, exist_ok=True)


@contextlib.contextmanager
def open_folder(
    folder: Path, root: Path | None = None, *, make: bool = False, what="duolm", error=ConfigError
) -> Iterator[int]:
    """The descriptor of ``folder`` itself, reached as ``parent_of`` reaches a name; a link at
    ``folder`` is refused when it lies below a root (the root itself may be a link of the
    user's)."""
    top = root_for(folder, root)
    if top is None or os.path.abspath(folder) == os.path.abspath(top):
        if make:
            make_folder_as_named(folder)
        fd = os.open(folder, FOLDER_FLAGS)
    else:
        with parent_of(folder, top, make=make, what=what, error=error) as (parent, name):
            fd = step_into(os.dup(parent), name, Path(folder), make=make, what=what, error=error)
    try:
        yield fd
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ files in a folder


def opened_regular(fd: int, path: Path, what: str, error, verb: str = "reads") -> int:
    """``fd`` when it is a regular file (its O_NONBLOCK cleared); otherwise closed and refused."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(
            f"{path} is {kind_of_mode(mode)}, not a regular file; {what} {verb} regular files only"
        )
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return fd


def open_at(folder_fd: int, name: str, flags: int, shown: Path, what: str, error) -> int:
    """``name`` opened in the open folder with ``flags`` (never through a final link)."""
    try:
        return os.open(name, flags, 0o666, dir_fd=folder_fd)
    except OSError as failure:
        if failure.errno in (errno.ELOOP, errno.EMLINK):
            refuse_link_at(folder_fd, name, shown, what, error)
        if failure.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
            raise error(
                f"{shown} is a FIFO (named pipe), not a regular file; {what} writes regular "
                "files only"
            ) from None
        raise with_path(failure, shown) from None


def new_file_in(folder: int, name: str) -> tuple[int, str]:
    """A new file beside ``name`` in the open folder, for a write renamed over ``name``."""
    while True:
        temporary = f".{name}.{secrets.token_hex(4)}.tmp"
        with contextlib.suppress(FileExistsError):
            return os.open(temporary, NEW_FILE_FLAGS, 0o666, dir_fd=folder), temporary


def fill_file(fd: int, data: bytes | str | Callable[[BinaryIO], None], durable: bool) -> None:
    with os.fdopen(fd, "wb") as handle:
        if callable(data):
            data(handle)
        else:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())


def copy_descriptor(source: int, target: int) -> None:
    """Every byte of the open file ``source`` (from its start) into ``target``."""
    offset = 0
    while chunk := os.pread(source, 1 << 20, offset):
        offset += len(chunk)
        while chunk:
            chunk = chunk[os.write(target, chunk) :]


def unshare(folder: int, name: str, fd: int, locked: bool) -> bool:
    """Give ``name`` a file of its own when its open file ``fd`` has other names (hard links):
    a copy of it renamed over ``name``, so an in-place write never changes the other names.
    ``locked``: hold the old file's lock while swapping, so no other holder of the lock can
    be running in this folder meanwhile (a holder would make the flock below fail). False
    when another process holds that lock: nothing is changed, and the caller's own flock
    will find the lock taken and say so, writing nothing."""
    if locked:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    reading = (
        os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        if os.path.isdir("/proc/self/fd")
        else None
    )
    copy, temporary = new_file_in(folder, name)
    try:
        copy_descriptor(fd if reading is None else reading, copy)
        os.fsync(copy)
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(copy)
        if reading is not None:
            os.close(reading)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=folder)
    return True


def refuse_special_at(folder: int, name: str, shown: Path) -> None:
    """Refuse an output ``name`` in the open folder that is anything but a regular file or a
    new name: a rename over it would replace a device node, a FIFO, a socket or a link."""
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = kind_of_mode(mode)
        if stat.S_ISLNK(mode):
            kind = f"a symbolic link to {os.readlink(name, dir_fd=folder)}"
        raise not_an_output_file(shown, kind)


def each_file_below(top: int, act: Callable[[int], object]) -> None:
    """Call ``act`` on a descriptor of every regular file below the open folder ``top`` (links
    and special files are skipped, never followed or opened)."""
    for _, _, files, folder in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        for name in files:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            except OSError:  # a link (ELOOP) or a file gone meanwhile
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    act(fd)
            finally:
                os.close(fd)
