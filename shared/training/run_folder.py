"""A run folder belongs to one run at a time.

Before a run writes anything it takes an exclusive lock on its folder (``<out>/.lock``, an
``flock`` the kernel releases when the process dies, holding the owner's PID and host) and checks
that the folder does not already hold another run: a new run in a used folder refuses unless
asked to ``--overwrite``, which moves the old run aside rather than deleting it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from shared.checkpoint import list_checkpoints, verify_checkpoint
from shared.errors import CheckpointError, ConfigError
from shared.files import current_umask

LOCK_FILE = ".lock"
# What a run writes into its folder; any of them means the folder holds a run.
RUN_FILES = ("config.json", "metrics.jsonl", "final.json", "checkpoints")


def holds_run(folder: Path) -> bool:
    return any((folder / name).exists() for name in RUN_FILES)


def _describe(holder: dict) -> str:
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}"


class RunFolderLock:
    """The exclusive lock on a run folder, held from ``acquire`` until ``release`` (or the end of
    the process). ``stale`` describes a previous holder that died without releasing it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / LOCK_FILE
        self.stale: str | None = None
        self._handle = None

    def acquire(self) -> RunFolderLock:
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError(f"--out {self.folder} is a file, not a folder; name a folder")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")  # held open for the life of the run
        except OSError as error:
            raise ConfigError(
                f"cannot write to the run folder {self.folder}: {error.strerror or error}"
            ) from error
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(handle)
            handle.close()
            raise ConfigError(
                f"the run folder {self.folder} is in use by another run ({_describe(holder)}, "
                f"since {holder.get('since', '?')}); wait for it to end or choose another --out"
            ) from None
        previous = _read_holder(handle)
        if previous and previous.get("pid") is not None:
            # The kernel released the flock when its holder died; its record stayed behind.
            self.stale = _describe(previous)
        handle.seek(0)
        handle.truncate()
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        handle.write(json.dumps(record))
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is None:
            return
        self._handle.seek(0)
        self._handle.truncate()  # an empty lock file is a released one, not a stale one
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None


def holder_if_locked(folder: Path) -> str | None:
    """Who holds ``folder``'s lock right now (None when nobody does), without taking it."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file():
        return None
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(_read_holder(handle))
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _read_holder(handle) -> dict:
    handle.seek(0)
    try:
        return json.loads(handle.read() or "{}")
    except json.JSONDecodeError:
        return {}


def claim_run_folder(folder: Path, *, resuming: bool, overwrite: bool) -> str | None:
    """Check that ``folder`` (already locked by this process) may take a new run. A folder that
    holds a run refuses unless the run is being resumed there, or ``overwrite`` moves the old run
    aside; returns where it was moved, if anywhere."""
    if resuming or not holds_run(folder):
        return None
    if not overwrite:
        if not list_checkpoints(folder / "checkpoints"):
            raise ConfigError(
                f"{folder} holds a run that stopped before its first checkpoint, so there is "
                "nothing to resume; start a new run over it with --overwrite (the old files are "
                "moved aside, not deleted) or choose another --out"
            )
        raise ConfigError(
            f"{folder} already holds a run; continue it with --resume {folder}, or start a new "
            "one over it with --overwrite (the old run is moved aside, not deleted)"
        )
    return move_aside(folder)


def claim_output_folder(out: Path, overwrite: bool, verb: str) -> str | None:
    """Check that ``out`` may take what a command writes (``verb``: "export", "import"): a new or
    empty folder, or with ``overwrite`` one whose contents are moved aside (returns where). A
    folder in use by a run is never written into, and nothing is written over without
    ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; name a folder to {verb} into")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    holder = holder_if_locked(out)
    if holder:
        raise ConfigError(f"{out} is in use by a run ({holder}); {verb} into another folder")
    what = "a training run" if holds_run(out) else "files"
    if not overwrite:
        raise ConfigError(
            f"{out} already holds {what}; {verb} into a new folder, or pass --overwrite to move "
            "what is there aside (not deleted)"
        )
    return move_aside(out)


def move_aside(folder: Path) -> str:
    """Move everything in ``folder`` but its lock into a new sibling folder
    ``<name>.replaced-<time>-<unique>``; returns its path. Nothing is deleted."""
    # mkdtemp picks a name no other folder has, atomically; then give it the usual mode.
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = Path(tempfile.mkdtemp(prefix=f"{folder.name}.replaced-{stamp}-", dir=folder.parent))
    os.chmod(aside, 0o777 & ~current_umask())
    for entry in folder.iterdir():
        if entry.name != LOCK_FILE:
            entry.rename(aside / entry.name)
    return str(aside)


def check_resume_point(folder: Path, checkpoint: Path) -> None:
    """Resuming into the run's own folder from ``checkpoint`` continues the run; a valid later
    checkpoint there means the run went on past it, and resuming would write over that branch:
    refuse and name the safe ways (a new folder, or the newest checkpoint)."""
    step = int(checkpoint.name.rsplit("_", 1)[-1])
    later = []
    for candidate in list_checkpoints(Path(folder) / "checkpoints"):
        if int(candidate.name.rsplit("_", 1)[-1]) > step:
            try:
                verify_checkpoint(candidate)
                later.append(candidate.name)
            except CheckpointError:
                pass  # an incomplete later checkpoint is what resuming from here recovers from
    if later:
        raise ConfigError(
            f"{checkpoint} is not the newest checkpoint of the run in {folder} (it also has "
            f"{', '.join(later)}); resuming there would overwrite them. Branch from it into a "
            f"new folder with --out NEW_FOLDER, or continue the run from its newest checkpoint "
            f"with --resume {folder}"
        )
