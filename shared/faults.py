"""Run-time fault handling shared by training: stop requests from signals, and fault injection.

Fault injection exists so the tests can prove that a crash, a kill or a NaN costs a run nothing
it cannot recover. It is driven by one environment variable and does nothing when it is unset:

    DUOLM_FAULTS="nan_loss@5,6,7;kill_in_checkpoint@12"

``nan_loss@S`` turns the loss of step S into NaN; ``kill_in_checkpoint@S`` sends SIGKILL to the
process half-way through writing the checkpoint of step S.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from functools import cache


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


class StopRequest:
    """SIGTERM/SIGINT ask the training loop to save and exit at the next step boundary; a second
    signal ends the process at once (with the default action of that signal).

    Handlers are installed only in the main thread and restored by ``close``.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame) -> None:
        if self.requested:  # second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signal_name = signal.Signals(signum).name
        print(
            f"\n{self.signal_name} received: saving a checkpoint at the end of this step "
            "(send it again to exit immediately)",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
