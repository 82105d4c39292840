"""One raw file event added to a real command, for the audit's break checks: the first time the
door writes a file in a folder named ``run``, ``open`` (a new file) or ``mkdir`` (a new folder)
is called once beside it directly, not through the door."""

import os
from pathlib import Path


def inject(kind: str) -> None:
    from shared import door

    write_atomic = door.write_atomic
    done = []

    def write_then_one_raw_event(path, *args, **kwargs):
        write_atomic(path, *args, **kwargs)
        if not done and Path(path).parent.name == "run":
            done.append(kind)
            beside = Path(path).parent / f"raw-{kind}"
            if kind == "open":
                open(beside, "w").close()  # noqa: SIM115 (the raw open under audit)
            else:
                os.mkdir(beside)

    door.write_atomic = write_then_one_raw_event
