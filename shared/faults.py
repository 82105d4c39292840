"""Run-time fault handling shared by training: stop requests from signals, and fault injection.

Fault injection exists so the tests can prove that a crash, a kill or a NaN costs a run nothing
it cannot recover. It is driven by one environment variable and does nothing when it is unset:

    DUOLM_FAULTS="nan_loss@5,6,7;kill_in_checkpoint@12"

``nan_loss@S`` turns the loss of step S into NaN; ``kill_in_checkpoint@S`` sends SIGKILL to the
process half-way through writing the checkpoint of step S; ``stall_in_step@S`` makes step S start
with one kernel that runs for minutes without returning to Python (as a step over a huge row
does), to test that a second signal still ends the process at once; ``oom_in_step@S`` makes
step S fail as torch's CPU allocator does when memory runs out; ``sleep_in_step@S`` makes step S
start with a one-second pause (a window for a test's signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from functools import cache

import torch


@cache
def _faults() -> dict[str, frozenset[int]]:
    spec = os.environ.get("DUOLM_FAULTS", "")
    faults: dict[str, frozenset[int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        name, _, steps = item.partition("@")
        faults[name] = frozenset(int(s) for s in steps.split(",") if s)
    return faults


def fault_active(name: str, step: int) -> bool:
    return step in _faults().get(name, frozenset())


def kill_now_if(name: str, step: int) -> None:
    if fault_active(name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def hold_step_if(step: int) -> None:
    """The faults that hold step ``step`` at its start: ``stall_in_step`` (minutes inside one
    kernel) and ``sleep_in_step`` (one second in Python)."""
    if fault_active("stall_in_step", step):
        # 2^30 by squaring: 30 products of 4096 x 4096 matrices inside one ATen call.
        torch.linalg.matrix_power(torch.eye(4096), 2**30)
    if fault_active("sleep_in_step", step):
        time.sleep(1.0)


def run_out_of_memory_if(name: str, step: int) -> None:
    if fault_active(name, step):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"
        )


class StageInterrupted(BaseException):
    """A signal left a stage that stores nothing until it is complete (a BaseException, so that
    no ``except Exception`` inside the stage swallows it)."""


class StopRequest:
    """SIGTERM/SIGINT ask the running job to stop at its next safe point (training: save a
    checkpoint at the end of the step; evaluation: after the current sample); a second signal
    ends the process at once, with exit status 128 + the signal's number (a scheduler's SIGTERM
    or SIGUSR1 repeated within ``REPEAT_WINDOW_S`` is the same request, see ``received``).

    Python runs signal handlers only when the main thread returns to the interpreter, which a
    long kernel (one training step over a huge row) may not do for minutes. So the handlers only
    wake a watcher thread through ``signal.set_wakeup_fd``; the watcher counts the signals and can
    end the process while the main thread is still inside the kernel (kernels release the GIL).
    Handlers are installed only in the main thread and restored by ``close``.
    """

    # SIGUSR1: what a Slurm job is sent before its time runs out (--signal=B:USR1@120)
    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    # A scheduler's stop, passed on by more than one layer (srun, the launcher, torchrun), may
    # arrive twice at once; within this window a repeat is the same request. Ctrl-C (SIGINT)
    # twice still exits at once.
    SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
    REPEAT_WINDOW_S = 5.0

    def __init__(self, on_stop: str = "saving a checkpoint at the end of this step") -> None:
        self.signal_name: str | None = None
        self._first: tuple[int, float] = (0, 0.0)  # the first signal and when it came
        self.on_stop = on_stop
        self.interrupt_stage: str | None = None
        self._previous: dict[int, object] = {}
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1
        if threading.current_thread() is threading.main_thread():
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            self._pipe = (read_end, write_end)
            self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            threading.Thread(target=self._watch, args=(read_end,), daemon=True).start()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame) -> None:
        """The Python-level handler, in the main thread: the watcher thread counts the signals;
        here a stage that keeps nothing half-done (``interrupt_stage``) is left at once."""
        if self.interrupt_stage:
            raise StageInterrupted(signal.Signals(signum).name)

    @contextlib.contextmanager
    def interrupting(self, stage: str):
        """A context in which a signal leaves ``stage`` at the next Python bytecode (raising
        ``StageInterrupted``) instead of at the next safe point: for stages whose result is
        stored only when complete."""
        saved = (self.interrupt_stage, self.on_stop)
        self.interrupt_stage = stage
        self.on_stop = f"stopping the {stage} stage now (finished stages are kept)"
        try:
            if self.requested:
                raise StageInterrupted(self.signal_name)
            yield
        finally:
            self.interrupt_stage, self.on_stop = saved

    def _watch(self, read_end: int) -> None:
        while True:
            try:
                data = os.read(read_end, 64)  # waits without the GIL
            except OSError:
                return
            if not data:  # close() closed the write end
                os.close(read_end)
                return
            for signum in data:
                if signum in self.SIGNALS:
                    self.received(signum)

    def received(self, signum: int) -> None:
        """Act on one delivery of ``signum``: the first asks for a stop, the second exits, except
        a scheduler's signal (SIGTERM, SIGUSR1) repeated within ``REPEAT_WINDOW_S`` of the
        first, which is the same request passed on twice (srun and torchrun may both do so)."""
        now = time.monotonic()
        if self.requested:
            if self.is_repeat(signum, now):
                print(
                    f"\n{signal.Signals(signum).name} again within {self.REPEAT_WINDOW_S:g} s: "
                    f"the same request ({self.on_stop})",
                    file=sys.stderr,
                    flush=True,
                )
                return
            print(f"\n{signal.Signals(signum).name} again: exiting now", file=sys.stderr)
            os._exit(128 + signum)
        self.signal_name, self._first = signal.Signals(signum).name, (signum, now)
        again = "send it again to exit immediately"
        if signum in self.SCHEDULER_SIGNALS:
            again = f"send it again after {self.REPEAT_WINDOW_S:g} s to exit immediately"
        print(
            f"\n{self.signal_name} received: {self.on_stop} ({again})", file=sys.stderr, flush=True
        )

    def is_repeat(self, signum: int, now: float) -> bool:
        first, first_at = self._first
        return (
            signum == first
            and signum in self.SCHEDULER_SIGNALS
            and now - first_at < self.REPEAT_WINDOW_S
        )

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._pipe[1])
            self._pipe = None
