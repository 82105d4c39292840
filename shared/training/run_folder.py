"""A run folder belongs to one run at a time.

Before a run writes anything it takes an exclusive lock on its folder (``<out>/.lock``, an
``flock`` the kernel releases when the process dies, holding the owner's PID and host) and checks
that the folder does not already hold another run (or a user's other files): a new run in a used
folder refuses unless asked to ``--overwrite``, which moves the old contents aside rather than
deleting them. Only what duolm made is ever moved (a run, an export, an import, a compare or
findings job, recognised by the record each leaves), and only after its path is checked: never
through a symbolic link, never the root, a mount point, the current folder or one above it, the
home folder, the Python environment, this project or a folder that holds the command's source.
A command refused before it wrote anything leaves no folder and no lock file behind.

Ownership is by a marker, never by guesswork: every folder a command makes holds ``.duolm``
(``MARKER``, JSON naming its kind: a run, an import, an export, a compare or findings job, token
shards). ``--overwrite`` and ``--force`` move aside only a folder with the marker, or an empty
one; a folder of a user's own files is never moved because it happens to hold a subfolder named
``checkpoints`` or ``stages``. A folder an earlier version made (its records, no marker) gets one
line saying how to move it by hand. Files here are opened through ``shared.door``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from shared import door
from shared.checkpoint import list_checkpoints
from shared.errors import DISK_FULL, ConfigError, free_space
from shared.files import cache_root, check_path_length
from shared.formats.exported import EXPORT_INFO
from shared.path_checks import kind_of_mode
from shared.strict_json import parse_json

LOCK_FILE = ".lock"
MARKER = ".duolm"
# The kinds of folder duolm makes, as the marker names them, in words.
KINDS = {
    "run": "a training run",
    "import": "a training run (an imported checkpoint)",
    "export": "an export",
    "compare job": "a compare job",
    "synthetic compare job": "a synthetic-language compare job",
    "sweep job": "a block-size sweep job",
    "exact frontier job": "an exact frontier job",
    "findings": "a findings folder (an index and one folder per finding)",
    "findings job": "a findings job",
    "shards": "token shards",
}
# The kinds a job command (compare, sweep, exact frontier, findings) claims: each takes its own
# kind's folder, and --force moves any of them aside.
JOB_KINDS = ("compare job", "synthetic compare job", "sweep job", "exact frontier job")
JOB_KINDS += ("findings", "findings job")
IMPORT_RECORD = "import.json"
# The records earlier versions left instead of a marker: named in a message, never trusted.
EARLIER_RECORDS = ("checkpoints", "metrics.jsonl", "final.json", "stages", "finding-code.json")
EARLIER_RECORDS += (IMPORT_RECORD, EXPORT_INFO)
JOB_STAGES = "stages"  # compare and sweep jobs store their stages here
FINDINGS_STAMP = "finding-code.json"


def mark_folder(folder: Path, kind: str) -> None:
    """Mark ``folder`` as made by duolm as a ``kind`` (``KINDS``); a folder already marked keeps
    its first kind (a resumed import stays an import)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of folder {kind!r}")
    if folder_kind(folder) is None:
        door.write_json_atomic(folder / MARKER, {"kind": kind, "made_by": "duolm"}, root=folder)


def folder_kind(folder: Path) -> str | None:
    """The kind ``folder``'s marker names; None without a (readable, known) marker."""
    try:
        record = door.read_json_file(Path(folder) / MARKER, root=folder, limit=4096)
    except (OSError, ValueError):
        return None
    kind = record.get("kind") if isinstance(record, dict) else None
    return kind if kind in KINDS else None


def holds_run(folder: Path) -> bool:
    return folder_kind(folder) in ("run", "import")


def made_here(folder: Path) -> str | None:
    """What this project made ``folder`` as (``KINDS``), read from its marker; None when it has
    no marker (a user's folder, or one an earlier version made: ``made_by_earlier_version``)."""
    return KINDS.get(folder_kind(folder) or "")


def made_by_earlier_version(folder: Path) -> bool:
    """Whether ``folder`` has no marker but holds records an earlier version left: said in a
    message (how to move it by hand), never a reason to move it."""
    return made_here(folder) is None and any(
        os.path.lexists(Path(folder) / name) for name in EARLIER_RECORDS
    )


def contents(folder: Path) -> list[str]:
    """The names of what ``folder`` holds besides its lock file (nothing when it is missing)."""
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir() if entry.name != LOCK_FILE)


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those above it that do not exist yet, deepest first: what ``mkdir -p``
    would create, and so what a refusal has to remove again."""
    missing = []
    for candidate in [folder, *folder.parents]:
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


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
        # What acquire found, so that release can leave a folder nothing was written to as it
        # was: the folders it made, whether it made the lock file, the names already there.
        self._created: list[Path] = []
        self._made_lock_file = False
        self._found: list[str] = []

    def acquire(self) -> RunFolderLock:
        check_path_length(self.folder, "--out")
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError(
                f"--out {self.folder} is {kind_of_path(self.folder)}, not a folder; name a folder"
            )
        refuse_inside_a_run(self.folder)
        door.declare_root(self.folder)  # every path below it is walked from it
        self._created = missing_folders(self.folder)
        self._made_lock_file = not self.path.exists()
        self._found = contents(self.folder)
        try:
            door.make_folders(self.folder)
            handle = self._locked_handle()
        except (OSError, ConfigError) as error:
            self._remove_created_folders()
            if isinstance(error, ConfigError):
                raise
            room = f" ({free_space(self.folder)})" if error.errno in DISK_FULL else ""
            raise ConfigError(
                f"cannot write to the run folder {self.folder}: {error.strerror or error}{room}"
            ) from error
        previous = _read_holder(handle)
        if previous and previous.get("pid") is not None:
            # The kernel released the flock when its holder died; its record stayed behind.
            self.stale = _describe(previous)
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        door.rewrite_lock_record(handle, json.dumps(record))
        self._handle = handle
        return self

    def _locked_handle(self):
        """The lock file, open and flocked. A releasing holder may unlink the file of a folder it
        leaves empty (``release``): a lock taken on that unlinked file protects nothing, so it is
        taken again on the file the path names now."""
        while True:
            handle = door.open_lock_file(self.path)  # held open for the life of the run
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(handle)
                handle.close()
                raise ConfigError(
                    f"the run folder {self.folder} is in use by another run "
                    f"({_describe(holder)}, since {holder.get('since', '?')}); wait for it to end "
                    "or choose another --out"
                ) from None
            try:
                if os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino:
                    return handle
            except FileNotFoundError:
                pass
            handle.close()

    def release(self) -> None:
        if self._handle is None:
            return
        door.rewrite_lock_record(self._handle, "")  # empty: released, not stale
        # A command that wrote nothing (refused, or failed before its first file) leaves the
        # folder as it found it: the lock file it made goes while still held, then the folders
        # it made.
        untouched = self._made_lock_file and contents(self.folder) == self._found
        if untouched:
            door.remove_file(self.path)
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None
        if untouched:
            self._remove_created_folders()

    def _remove_created_folders(self) -> None:
        for folder in self._created:  # deepest first; a folder something was written to stays
            try:
                door.remove_empty_folder(folder)
            except OSError:
                break
        self._created = []


def holder_if_locked(folder: Path) -> str | None:
    """Who holds ``folder``'s lock right now (None when nobody does), without taking it."""
    holder = lock_holder(folder)
    return None if holder is None else _describe(holder)


def lock_holder(folder: Path) -> dict | None:
    """The record of whoever holds ``folder``'s lock right now (None when nobody does)."""
    path = Path(folder) / LOCK_FILE
    try:
        with door.open_read(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_holder(handle)
            fcntl.flock(handle, fcntl.LOCK_UN)
    except (OSError, ConfigError):  # no lock file (none this user may read, or not a file)
        return None
    return None


def refuse_inside_a_run(folder: Path) -> None:
    """Refuse a folder inside another command's locked folder, or inside a run's
    ``checkpoints/``: writing there (or moving its contents aside) would change a run behind
    its back. This process's own locks (an experiment training runs in its job folder) are
    not another command's."""
    resolved = folder.resolve()
    for above in resolved.parents:
        holder = lock_holder(above)
        if holder and holder.get("pid") != os.getpid():
            raise ConfigError(
                f"{folder} is inside {above}, which is in use by a run ({_describe(holder)}); "
                "choose a folder outside it"
            )
        if (above / "checkpoints" == resolved or above / "checkpoints" in resolved.parents) and (
            holds_run(above)
        ):
            raise ConfigError(
                f"{folder} is inside the checkpoints of the run in {above}; choose a folder "
                "outside it"
            )


def _read_holder(handle) -> dict:
    handle.seek(0)
    try:
        record = parse_json(handle.read(4096) or "{}", "lock")
    except ConfigError:  # a damaged lock record
        return {}
    return record if isinstance(record, dict) else {}


def claim_run_folder(
    folder: Path, *, resuming: bool, overwrite: bool, sources: Sequence[Path] = ()
) -> str | None:
    """Check that ``folder`` (already locked by this process) may take a new run. A folder that
    holds a run, or another folder duolm made, refuses unless the run is being resumed there, or
    ``overwrite`` moves what is there aside (``sources``: what the run starts from, never moved);
    a folder of other files always refuses. Returns where the old contents went, if anywhere."""
    if resuming or not contents(folder):
        return None
    if overwrite:
        return move_aside(folder, sources)  # or the one reason it may not
    made = made_here(folder)
    if made is None:
        raise ConfigError(f"{folder} {not_ours(folder)}; train into a new or empty folder")
    why_not = why_not_movable(folder, sources)
    start_over = (
        f"start a new run in another folder ({folder} {why_not})"
        if why_not
        else "start a new one over it with --overwrite (the old files are moved aside, not deleted)"
    )
    if not holds_run(folder):
        raise ConfigError(
            f"{folder} already holds {made}; train into a new folder, or {start_over}"
        )
    if not list_checkpoints(folder / "checkpoints"):
        raise ConfigError(
            f"{folder} holds a run that stopped before its first checkpoint, so there is nothing "
            f"to resume; {start_over}, or choose another --out"
        )
    raise ConfigError(
        f"{folder} already holds a run; continue it with --resume {folder}, or {start_over}"
    )


def listing(folder: Path, shown: int = 3) -> str:
    names = contents(folder)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def what_it_holds(folder: Path) -> str:
    """What a used output folder holds, in words, from the record each command leaves."""
    made, kind = made_here(folder), folder_kind(folder)
    record = {"run": "config.json", "import": IMPORT_RECORD}.get(kind or "")
    if record and not (folder / record).is_file():
        return "the files of a run or import that stopped before it finished"
    return made or f"files duolm did not make ({listing(folder)})"


def claim_output_folder(
    out: Path, overwrite: bool, verb: str, sources: Sequence[Path] = ()
) -> str | None:
    """Check that ``out`` may take what a command writes (``verb``: "export", "import"): a new or
    empty folder, or with ``overwrite`` one whose contents are moved aside (returns where). A
    folder in use by a run (or inside one) is never written into, nothing is written over
    without ``overwrite``, and nothing is moved that ``move_aside`` refuses (``sources``: what the
    command reads)."""
    if not output_folder_is_used(out, overwrite, verb, sources):
        return None
    return move_aside(out, sources)


def output_folder_is_used(
    out: Path, overwrite: bool, verb: str, sources: Sequence[Path] = ()
) -> bool:
    """``claim_output_folder``'s checks, without moving anything: whether ``out`` holds
    something that ``overwrite`` may move aside; a refusal otherwise."""
    check_path_length(out, f"the {verb} folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is {kind_of_path(out)}; name a folder to {verb} into")
    refuse_inside_a_run(out)
    if not out.is_dir() or not any(out.iterdir()):
        return False
    holder = holder_if_locked(out)
    if holder:
        raise ConfigError(f"{out} is in use by a run ({holder}); {verb} into another folder")
    why_not = why_not_movable(out, sources)
    if why_not:
        raise ConfigError(
            f"{out} already holds {what_it_holds(out)} and {why_not}; {verb} into a new folder"
        )
    if not overwrite:
        raise ConfigError(
            f"{out} already holds {what_it_holds(out)}; {verb} into a new folder, or pass "
            "--overwrite to move what is there aside (not deleted)"
        )
    return True


def kind_of_path(path: Path) -> str:
    """What ``path`` is, in words, without following a final symbolic link."""
    return kind_of_mode(path.lstat().st_mode, path)


def protected_places() -> dict[str, Path]:
    """What no move may take from under the user or this command: the home folder, the Python
    environment running the command, this project's code and duolm's cache (resolved)."""
    places = {
        "the home folder": Path.home(),
        "the Python environment this command runs in": Path(sys.prefix),
        "the Python installation this command runs on": Path(sys.base_prefix),
        "the Python interpreter": Path(sys.executable),
        "this project's code": Path(__file__).resolve().parents[2],
        "duolm's cache": cache_root(),
    }
    return {what: path.resolve() for what, path in places.items()}


def why_not_movable(folder: Path, sources: Sequence[Path] = ()) -> str | None:
    """Why moving the contents of ``folder`` aside must not happen (None when it may). Judged on
    resolved paths: a symbolic link is never followed into a move; the root, a mount point, the
    folder the command runs in (or one above it), one that holds the home folder, the Python
    environment, this project or what the command reads would pull the ground from under the
    user; and only what duolm made (``made_here``) or an empty folder is ever moved."""
    folder = Path(folder)
    if folder.is_symlink():
        return (
            f"cannot be moved aside: it is a symbolic link to {folder.resolve()} (a link is "
            "never followed into a move; name the folder itself if that is what you mean)"
        )
    resolved = folder.resolve()
    if resolved.parent == resolved:
        return f"cannot be moved aside: {resolved} is the root of the file system"
    if os.path.ismount(resolved):
        return f"cannot be moved aside: {resolved} is a mount point"
    here = Path.cwd().resolve()
    if here == resolved or resolved in here.parents:
        return f"cannot be moved aside: {resolved} is the current folder or holds it"
    for what, place in protected_places().items():
        if place == resolved or resolved in place.parents:
            return f"cannot be moved aside: {resolved} is or holds {what} ({place})"
    for source in sources:
        source = Path(source).resolve()
        if source == resolved or resolved in source.parents:
            return f"cannot be moved aside: {resolved} holds the source {source}"
    if contents(resolved) and made_here(resolved) is None:
        return f"cannot be moved aside: it {not_ours(resolved)}"
    return None


def not_ours(folder: Path) -> str:
    """Why ``folder`` (not empty, no marker) is not duolm's to move, in words."""
    if made_by_earlier_version(folder):
        held = ", ".join(n for n in EARLIER_RECORDS if os.path.lexists(Path(folder) / n))
        return (
            f"has no {MARKER} marker but holds {held} as a run does (an earlier version of "
            f"duolm's run, or a folder of your own): it is never moved for you; move it by hand "
            f"(mv {folder} {folder}.old) and run again"
        )
    return (
        f"holds files duolm did not make ({listing(folder)}); --overwrite and --force move only "
        f"a folder duolm made (marked by its {MARKER} file) or an empty one"
    )


def move_aside(folder: Path, sources: Sequence[Path] = ()) -> str:
    """Move everything in ``folder`` but its lock into a new sibling folder
    ``<name>.replaced-<time>-<unique>``; returns its path. Nothing is deleted, and nothing is
    moved when ``why_not_movable`` refuses (``sources``: what the command reads)."""
    why_not = why_not_movable(folder, sources)
    if why_not:
        raise ConfigError(f"{folder} {why_not}; choose another folder")
    resolved = folder.resolve()
    # a name no other folder has, made atomically, with the usual mode
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = door.make_temp_folder(
        resolved.parent, f"{resolved.name}.replaced-{stamp}-", private=False
    )
    for entry in resolved.iterdir():
        if entry.name != LOCK_FILE:
            door.rename(entry, aside / entry.name)
    return str(aside)
