"""What the processes of one launch agree on before training: a decision taken once, on the
main process, and given to every other (``decided_on_main``), and how long any of them waits
for the others (``wait_timeout``) before it gives up with one line.

Under ``accelerate launch`` / torchrun every process runs ``train.py`` from the top, so a choice
that reads the disk (the checkpoint ``--resume`` continues from, which checks every checkpoint's
digests) would be made once per process: N times the reading, N copies of each line it prints,
and, with a checkpoint landing or failing between two reads, processes that disagree. Here the
main process decides and the others wait for its answer, saying what they wait for.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch
from accelerate import PartialState

from shared.errors import CheckpointError, ConfigError, ResourceUnavailableError

T = TypeVar("T")

WAIT_TIMEOUT_VARIABLE = "DUOLM_WAIT_TIMEOUT"
DEFAULT_WAIT_TIMEOUT_S = 1800.0  # torch's own default for a process group


def wait_timeout() -> timedelta:
    """How long one process waits for the others (joining, and at every collective), from
    ``DUOLM_WAIT_TIMEOUT`` (seconds; default 1800)."""
    text = os.environ.get(WAIT_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return timedelta(seconds=DEFAULT_WAIT_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= 7 * 86400):
        raise ConfigError(
            f"{WAIT_TIMEOUT_VARIABLE}={text!r} must be a number of seconds in (0, 604800]"
        )
    return timedelta(seconds=seconds)


def launched_processes() -> int:
    """The number of processes of this launch (1 when run plainly)."""
    text = os.environ.get("WORLD_SIZE", "1")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def join_processes():
    """The launch's process group (accelerate's ``PartialState``, which the run's Accelerator
    reuses), joined with ``wait_timeout``; says on the main process what it waits for."""
    timeout = wait_timeout()
    if int(os.environ.get("RANK", "0")) == 0 and not torch.distributed.is_initialized():
        print(
            f"waiting for the {launched_processes()} processes of this launch to join "
            f"(up to {timeout.total_seconds():g} s; {WAIT_TIMEOUT_VARIABLE} sets it)",
            flush=True,
        )
    try:
        return PartialState(cpu=not torch.cuda.is_available(), timeout=timeout)
    except RuntimeError as error:  # the store or a peer did not answer in time
        raise ResourceUnavailableError(
            f"the processes of this launch did not all join within {timeout.total_seconds():g} s "
            f"({first_line(error)}); check the launch, or set {WAIT_TIMEOUT_VARIABLE} to wait "
            "longer"
        ) from None


def decided_on_main(what: str, decide: Callable[[], T]) -> T:
    """``decide()`` run on the main process alone, its result given to every process. A user
    error raised there is raised on every process; the others wait at most ``wait_timeout``,
    and say once what they wait for."""
    if launched_processes() == 1:
        return decide()
    state = join_processes()
    answer: list = [None]
    if state.is_main_process:
        try:
            answer = [("decided", decide())]
        except (ConfigError, CheckpointError, ResourceUnavailableError) as error:
            answer = [("refused", error)]
    elif state.local_process_index == 0:
        print(f"process {state.process_index} waits for the main process to {what}", flush=True)
    timeout = wait_timeout().total_seconds()
    try:
        torch.distributed.broadcast_object_list(answer, src=0)
    except RuntimeError as error:
        gave_up = ResourceUnavailableError(
            f"process {state.process_index} waited {timeout:g} s for the main process to "
            f"{what} and got no answer ({first_line(error)}); set {WAIT_TIMEOUT_VARIABLE} to "
            "wait longer"
        )
        gave_up.own_error = True  # this process's own: it reports it (shared.errors)
        raise gave_up from None
    kind, value = answer[0]
    if kind == "refused":
        raise value  # the main process reported it; every process stops with status 2
    return value


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__
