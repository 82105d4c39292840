"""The errors a user can cause, and how every command line reports them.

A user error (a bad value, a missing file, an unusable checkpoint, a resource this machine cannot
reach) is one line on stderr and exit status 2; so is a disk that cannot take what a command
writes (full, over quota, read-only, not permitted), named with its path and the free space.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import getpass
import os
import re
import select
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from safetensors import SafetensorError

T = TypeVar("T")


class ConfigError(ValueError):
    """A user setting is invalid; the message names the field, the value and what is valid."""


class ResourceUnavailableError(RuntimeError):
    """Something the run needs cannot be reached here (a hub dataset offline, a missing wheel);
    the message says what to install or use instead."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupted."""


class StoppedBySignal(Exception):
    """A command stopped by a signal (SIGTERM, SIGUSR1) after leaving what it was writing whole
    or removed; the message says so, and the command line exits with ``STOPPED_STATUS``."""


# EX_TEMPFAIL, "try again": what a command stopped by a signal exits with, so that a scheduler
# requeues it (train.py's REQUEUE_STATUS is the same number).
STOPPED_STATUS = 75


# What the command lines report as one line and exit status 2: bad values (ConfigError is a
# ValueError), missing files, unusable checkpoints, unreachable resources.
USER_ERRORS = (ValueError, FileNotFoundError, CheckpointError, ResourceUnavailableError)


# The OS errors that say the disk cannot take a write, rather than that the command is wrong.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})

# safetensors' Rust code reports an OS error inside its message: "... (os error 28) at path
# "/x"" (0.5 and later) or "IoError(Os { code: 28, kind: StorageFull, ... })" (earlier).
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")
_RUST_PATH = re.compile(r'at path "([^"]+)"')


def os_error_in(error: BaseException) -> OSError | None:
    """The OS error ``error`` is or reports: itself, or the one in a ``SafetensorError``'s
    message (with the path it names, if any); None for any other error."""
    if isinstance(error, OSError):
        return error
    if not isinstance(error, SafetensorError):
        return None
    found = _RUST_OS_ERROR.search(str(error))
    if not found:
        return None
    code = int(found.group(1) or found.group(2))
    path = _RUST_PATH.search(str(error))
    return OSError(code, os.strerror(code), path.group(1) if path else None)


def with_path(error: BaseException, path: str | Path) -> BaseException:
    """``error`` as an ``OSError`` naming ``path`` when it is (or reports) an OS error that names
    none (a write to an open file, safetensors' temporary name): what the report can name."""
    found = os_error_in(error)
    if found is None:
        return error
    if found.filename is None or found is not error:
        found = OSError(found.errno, found.strerror or os.strerror(found.errno), str(path))
    return found


def human_size(n_bytes: float) -> str:
    """``n_bytes`` in bytes, KB, MB, GB or TB (powers of 1024)."""
    if n_bytes < 1024:
        return f"{n_bytes} bytes"
    size, unit = n_bytes / 1024, "KB"
    for larger in ("MB", "GB", "TB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{size:.1f} {unit}"


def nearest_existing(path: Path) -> Path:
    """``path`` or the nearest folder above it that exists (where free space can be measured)."""
    for candidate in [path, *path.parents]:
        if candidate.exists():
            return candidate
    return Path(".")


def free_space(path: Path) -> str:
    """How much room the file system of ``path`` has left, in words."""
    where = nearest_existing(path.absolute())
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return f"free space unknown on {where}"
    return f"{human_size(usage.free)} free of {human_size(usage.total)} on {where}"


def disk_error_message(error: BaseException) -> str | None:
    """One line for an error that says the disk cannot take a write (full, over quota,
    read-only, not permitted), naming the path and the free space or the permission problem;
    None for any other error."""
    found = os_error_in(error)
    if found is None or found.errno not in DISK_FULL | NOT_WRITABLE:
        return None
    path = found.filename2 or found.filename
    named = f" writing {path}" if path is not None else ""
    reason = found.strerror or os.strerror(found.errno)
    if found.errno in DISK_FULL:
        room = free_space(Path(path)) if path is not None else "free space unknown"
        return (
            f"{reason}{named} ({room}); free some space or choose an output on another disk, "
            "then run the command again"
        )
    if found.errno == errno.EROFS:
        return f"{reason}{named}: choose an output folder on a writable disk"
    # Permission is refused to readers too: the line names the path, not a direction.
    on = f": {path}" if path is not None else ""
    return (
        f"{reason}{on} (running as {_user_name()}); change its permissions or choose another path"
    )


def long_name_message(error: BaseException) -> str | None:
    """One line for a path the file system refuses as too long (ENAMETOOLONG: a name longer than
    NAME_MAX, 255 bytes on most, or a path longer than PATH_MAX); None for any other error."""
    found = os_error_in(error)
    if found is None or found.errno != errno.ENAMETOOLONG:
        return None
    path = str(found.filename2 or found.filename or "a path")
    shown = path if len(path) <= 60 else f"{path[:40]}... ({len(path)} characters)"
    return (
        f"{found.strerror or os.strerror(found.errno)}: {shown} (a name in it is longer than the "
        "file system takes, or the whole path is); choose a shorter path"
    )


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def result_or_status(
    job: Callable[[], T], also: tuple[type[BaseException], ...] = ()
) -> tuple[T | None, int]:
    """Run a command line's ``job``: (its result, 0) when it returns, (None, 2) with one
    ``error: ...`` line on stderr when it raises a user error (or one of ``also``) or meets a
    disk that cannot take its writes (``disk_error_message``), (None, 75) with its line when a
    signal stopped it (``StoppedBySignal``).
    ``DUOLM_DEBUG=1`` re-raises instead, to show the traceback."""
    try:
        return job(), 0
    except BrokenPipeError:
        # The reader of stdout went away (``| head``): stop quietly, as shell tools do, with
        # the status of a SIGPIPE; any other broken pipe is a fault and propagates.
        if not stdout_is_broken():
            raise
        return None, 128 + 13
    except StoppedBySignal as stopped:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {stopped}", file=sys.stderr)
        return None, STOPPED_STATUS
    except KeyboardInterrupt:
        # Ctrl-C: every writer removes what it left half-written on the way out (the door's
        # temp-and-rename, ``removed_if_unfinished``); one line and the shell's status for it
        if os.environ.get("DUOLM_DEBUG"):
            raise
        if os.environ.get("RANK", "0") == "0":
            print("error: stopped by Ctrl-C (SIGINT)", file=sys.stderr)
        return None, 128 + signal.SIGINT
    except BaseException as error:
        # The disk's errors first (a PermissionError is no user error of the other kinds); their
        # notes (where a run can resume from) follow the line.
        message = disk_error_message(error) or long_name_message(error)
        if message is not None:
            message = "; ".join([message, *getattr(error, "__notes__", [])])
        elif isinstance(error, (*USER_ERRORS, *also)):
            message = str(error)
        if message is None or os.environ.get("DUOLM_DEBUG"):
            raise
        # Under a launcher every process meets the same error; the first one reports it, unless
        # the error is this process's own (``own_error``: a wait only it gave up on).
        if os.environ.get("RANK", "0") == "0" or getattr(error, "own_error", False):
            print(f"error: {message}", file=sys.stderr)
        return None, 2


def stdout_is_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (polling it reports an error); if so,
    stdout is pointed at the null device, so that the interpreter's own flush at exit does not
    fail again with a traceback."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        broken = any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return False
    if broken:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return broken


def report_user_errors(
    job: Callable[[], object], also: tuple[type[BaseException], ...] = ()
) -> int:
    """The exit status of ``job`` under ``result_or_status``."""
    return result_or_status(job, also)[1]
