"""The errors a user can cause, and how every command line reports them.

A user error (a bad value, a missing file, an unusable checkpoint, a resource this machine cannot
reach) is one line on stderr and exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A user setting is invalid; the message names the field, the value and what is valid."""


class ResourceUnavailableError(RuntimeError):
    """Something the run needs cannot be reached here (a hub dataset offline, a missing wheel);
    the message says what to install or use instead."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupted."""


# What the command lines report as one line and exit status 2: bad values (ConfigError is a
# ValueError), missing files, unusable checkpoints, unreachable resources.
USER_ERRORS = (ValueError, FileNotFoundError, CheckpointError, ResourceUnavailableError)


def result_or_status(
    job: Callable[[], T], also: tuple[type[BaseException], ...] = ()
) -> tuple[T | None, int]:
    """Run a command line's ``job``: (its result, 0) when it returns, (None, 2) with one
    ``error: ...`` line on stderr when it raises a user error (or one of ``also``).
    ``DUOLM_DEBUG=1`` re-raises instead, to show the traceback."""
    try:
        return job(), 0
    except (*USER_ERRORS, *also) as error:
        if os.environ.get("DUOLM_DEBUG"):
            raise
        # Under a launcher every process meets the same error; the first one reports it.
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr)
        return None, 2


def report_user_errors(
    job: Callable[[], object], also: tuple[type[BaseException], ...] = ()
) -> int:
    """The exit status of ``job`` under ``result_or_status``."""
    return result_or_status(job, also)[1]
