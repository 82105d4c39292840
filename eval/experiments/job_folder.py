"""How a job command claims its output folder, as a run claims its own: before a job command
(compare, the block sweep, the exact frontier, findings) reads or writes anything under its
``--out``, the folder must be new, empty, or one its own kind of job made (its ``.duolm`` marker
says so); anything else is refused in one line. ``--force`` moves aside (never deletes) only a
folder some job made, or an empty one. A folder that holds a symbolic link anywhere below it is
refused before anything in it is read: a received job folder whose ``seed-0/`` or ``stages/`` is
a link would otherwise have the job read stages from, and train and write into, a folder outside
it."""

from __future__ import annotations

import os
from pathlib import Path

from shared.errors import ConfigError
from shared.path_checks import refuse_links_within
from shared.training.run_folder import (
    JOB_KINDS,
    KINDS,
    MARKER,
    RunFolderLock,
    contents,
    folder_kind,
    listing,
    made_by_earlier_version,
    mark_folder,
    move_aside,
    not_ours,
)


def refuse_links_in_job(out: Path) -> None:
    """Refuse ``out`` when it, or anything below it, is a symbolic link (or a FIFO, socket or
    device): checked before the job reads a stage, a seed folder or a report from it."""
    if os.path.lexists(out):
        refuse_links_within(out, "a job folder")


def claim_job_folder(
    out: Path, force: bool, kind: str = "compare job", keep_own: bool = False
) -> RunFolderLock:
    """Lock ``out`` for the whole job (a second job on it exits at once, naming the first) and
    make it this ``kind`` of job's folder: a new or empty folder is marked; a folder this kind
    of job made is continued, or with ``force`` moved aside so the job starts over (``keep_own``:
    kept, for a job that redoes its parts itself); every other folder is refused, the lock
    released and the folder left as it was."""
    refuse_links_in_job(out)
    lock = RunFolderLock(out).acquire()
    try:
        aside = settle_job_folder(out, force and not (keep_own and folder_kind(out) == kind), kind)
    except ConfigError:
        lock.release()
        raise
    if aside:
        print(f"--force: moved the earlier job in {out} aside to {aside}")
    mark_folder(out, kind)
    return lock


def settle_job_folder(out: Path, force: bool, kind: str) -> str | None:
    """Check that ``out`` (locked) may hold a ``kind`` job (``check_job_folder``); with
    ``force``, move what it holds aside and return where (None when nothing moved)."""
    check_job_folder(out, force, kind)
    return move_aside(out) if force and contents(out) else None


def check_job_folder(out: Path, force: bool, kind: str) -> None:
    """Refuse in one line, moving nothing, an ``out`` that may not hold a ``kind`` job: a folder
    of files duolm did not make (a forged or linked marker is no marker), another kind of
    folder without ``force``, a folder that is no job's (a run, an export) even with it."""
    if not contents(out):
        return
    found = folder_kind(out)
    if found == kind or (force and found in JOB_KINDS):
        return
    raise ConfigError(job_folder_refusal(out, found, kind, force))


def job_folder_refusal(out: Path, found: str | None, kind: str, force: bool) -> str:
    """Why ``out`` (holding ``found``'s kind of folder, None: no marker) takes no ``kind`` job."""
    wanted = KINDS[kind]
    if found is None and made_by_earlier_version(out):
        return f"{out} {not_ours(out)}"
    findings = marked_findings(out) if found is None and kind == "findings" else []
    if findings:
        return (
            f"{out} has no {MARKER} marker but holds findings' folders ({', '.join(findings)}): "
            "an earlier version of duolm's findings folder, or one of your own; it is never "
            f"written into for you: move it by hand (mv {out} {out}.old) and run again"
        )
    if found is None:
        moved_by_force = (
            f"; --force moves aside only a folder duolm made (marked by its {MARKER} file) or "
            "an empty one"
            if force
            else ""
        )
        return (
            f"{out} holds files duolm did not make ({listing(out)}); {wanted} is written "
            f"only into a new or empty folder, or one {wanted} made{moved_by_force}: choose "
            "another --out"
        )
    if found not in JOB_KINDS:
        return (
            f"{out} holds {KINDS[found]}, not {wanted}; --force moves aside only a job's "
            "folder: choose another --out"
        )
    return (
        f"{out} holds {KINDS[found]}, not {wanted}: choose another --out, or pass --force "
        "to move it aside (not deleted) and start there"
    )


def marked_findings(out: Path) -> list[str]:
    """The folders in ``out`` marked as a finding's: an unmarked ``out`` holding them is an
    earlier version's findings folder (said in a message, never a reason to write there)."""
    return sorted(
        entry.name
        for entry in out.iterdir()
        if entry.is_dir() and not entry.is_symlink() and folder_kind(entry) == "findings job"
    )
