"""The code that trained a run, recorded in its folder (``provenance.json``), and the rule a
report applies to it.

A run's record is a list of segments, one per invocation that trained it: the steps it covered,
the git commit, whether the tree had uncommitted changes, and the training code it loaded (each
file of ``train.py``, ``shared/``, ``arlm/`` and ``dllm/`` with its hash as first read, the way
the stage cache keys a stage: ``shared.code_state``) with one key naming that code. A segment is
taken when training starts and checked when it ends (``final.json``): a training file whose
bytes changed meanwhile is listed in ``edited_during_training``, and the run is dirty. A resume
appends a segment; a branch starts with the segments of the run it continues, up to its
checkpoint; a run started from another run's weights (``--init-from``) keeps that run's
record. ``mixed`` says that the segments ran under more than one commit or code key.

    begin_run(out, resume_from, start_step, init_from)   # config.json's moment
    ...train...
    end_run(out, end_step)                               # just before final.json
    why_not_reproducible(read_run_provenance(out), report_commit)   # [] when clean
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared import door
from shared.code_state import PROJECT_ROOT, code_key, file_hash, git_state, loaded_hash, stage_code
from shared.errors import ConfigError
from shared.training.run_folder import folder_kind

RECORD = "provenance.json"
# Training code: eval/ and bench/ only choose what to train, which config.json records, so a job
# that trains in its own process keys its runs by the same files as train.py does.
TRAINING_FOLDERS = ("shared", "arlm", "dllm")
UNKNOWN = "trained before runs recorded their code"
# How many files a reason names before it counts the rest.
NAMED_FILES = 3


def training_code(before: dict[str, str] | None = None) -> dict[str, str]:
    """The training code this process loaded: each file's path -> its hash as first read."""
    return {
        path: digest
        for path, digest in stage_code(before).items()
        if path == "train.py" or path.split("/")[0] in TRAINING_FOLDERS
    }


def files_on_disk(paths: list[str]) -> dict[str, str | None]:
    """Each project file's hash as it is on disk now (not as first read): an edit shows."""
    return {path: file_hash(PROJECT_ROOT / path) for path in paths}


def started_segment(start_step: int) -> dict[str, Any]:
    """The segment of the invocation that trains from ``start_step``, as it starts."""
    code = training_code()
    return {
        "from_step": start_step,
        "to_step": None,  # set when the segment is checked at its end
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        **git_state(),
        "code_key": code_key(code),
        "code": code,
        "checked_at": None,
        "edited_during_training": [],
    }


def checked_segment(segment: dict[str, Any], end_step: int, when: str) -> dict[str, Any]:
    """``segment`` closed at ``end_step``: its code read again from disk; ``when`` says which
    moment checked it (the run's end, or the resume after a process that died)."""
    code = segment["code"] if when != "end" else training_code(segment["code"])
    now = files_on_disk(sorted(code))
    edited = sorted(path for path, digest in code.items() if now[path] != digest)
    return segment | {
        "to_step": end_step,
        "code_key": code_key(code),
        "code": code,
        "checked_at": when,
        "edited_during_training": edited,
    }


def read_run_provenance(folder: Path) -> dict[str, Any] | None:
    """The record in run ``folder``; None for a run trained before runs kept one."""
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    record = door.read_json_object(path, root=folder)
    if not isinstance(record.get("segments"), list):
        raise ConfigError(f"{path} has no list of segments; train the run again")
    return record


def with_mixed(segments: list[dict[str, Any]], init_from: dict | None) -> dict[str, Any]:
    """The record of ``segments``: ``mixed`` when they ran under more than one code."""
    codes = {(s.get("git_commit"), s.get("code_key"), bool(s.get("unknown"))) for s in segments}
    return {"segments": segments, "mixed": len(codes) > 1, "init_from": init_from}


def earlier_segments(resume_from: Path, start_step: int) -> tuple[list[dict], dict | None]:
    """The segments that made the weights a resume starts from, with where that run's first
    weights came from: the recorded segments up to ``start_step`` of the folder the checkpoint
    belongs to (this run's, or the run a branch continues), a segment still open (its process
    died) checked now; one unknown segment where that folder kept no record."""
    source = Path(resume_from).parent.parent
    if folder_kind(source) == "import" and not (source / RECORD).is_file():
        return [], init_source(resume_from)  # imported weights, continued here
    record = read_run_provenance(source)
    if record is None:
        return [{"from_step": 0, "to_step": start_step, "unknown": True}], None
    kept = []
    for segment in record["segments"]:
        if segment["from_step"] >= start_step:
            continue  # redone by this invocation
        if segment.get("to_step") is None:
            segment = checked_segment(segment, start_step, "resume")
        kept.append(segment | {"to_step": min(segment["to_step"], start_step)})
    return kept, record.get("init_from")


def init_source(checkpoint: Path) -> dict[str, Any]:
    """Where a run started with another run's weights (``--init-from``) took them: that run's
    record (None when it kept none), or an imported checkpoint, which this project did not
    train."""
    folder = Path(checkpoint).parent.parent
    if folder_kind(folder) != "run":
        return {"checkpoint": str(checkpoint), "imported": True, "record": None}
    return {"checkpoint": str(checkpoint), "imported": False, "record": read_run_provenance(folder)}


def begin_run(out: Path, resume_from: Path | None, start_step: int, init_from: Path | None) -> None:
    """Record, in ``out``, the code the run starts training under, after what came before: the
    segments it continues (``resume_from``) or the run its first weights came from."""
    segments, source = [], init_source(init_from) if init_from else None
    if resume_from is not None:
        segments, source = earlier_segments(resume_from, start_step)
    record = with_mixed(segments + [started_segment(start_step)], source)
    door.write_json_atomic(out / RECORD, record, durable=False)


def end_run(out: Path, end_step: int) -> dict[str, Any]:
    """Check the code of the segment training now ends, and record it; the record."""
    record = read_run_provenance(out)
    if record is None or not record["segments"]:  # removed during training: nothing to check
        record = {"segments": [{"from_step": 0, "to_step": end_step, "unknown": True}]}
    last = record["segments"][-1]
    ended = last if last.get("unknown") else checked_segment(last, end_step, "end")
    segments = record["segments"][:-1] + [ended]
    record = with_mixed(segments, record.get("init_from"))
    door.write_json_atomic(out / RECORD, record, durable=False)
    return record


def record_made_in_one_piece(
    out: Path, segment: dict[str, Any], end_step: int, init_from: Path
) -> None:
    """The record of a run made outside the training loop in one piece (a distilled student):
    its one segment, taken before it trained and checked now, and the run it started from."""
    record = with_mixed([checked_segment(segment, end_step, "end")], init_source(init_from))
    door.write_json_atomic(out / RECORD, record, durable=False)


def named(paths: list[str]) -> str:
    more = len(paths) - NAMED_FILES
    return ", ".join(paths[:NAMED_FILES]) + (f" and {more} more" if more > 0 else "")


def code_unlike_today(code: dict[str, str]) -> list[str]:
    """The files of ``code`` whose hash differs from this process's code (as first read)."""
    return sorted(
        path for path, digest in code.items() if loaded_hash(PROJECT_ROOT / path) != digest
    )


def why_not_reproducible(record: dict[str, Any] | None, commit: str | None) -> list[str]:
    """Why a report at ``commit`` (this process's code) cannot regenerate a run with this
    ``record``: one phrase a reason, [] when it can (one known commit, the report's; no
    uncommitted changes; nothing edited during training; the report's own training code)."""
    if record is None:
        return [UNKNOWN]
    segments = record["segments"]
    reasons = []
    unknown = [s["to_step"] for s in segments if s.get("unknown")]
    if unknown:
        reasons.append(f"its steps before {max(unknown)} were {UNKNOWN}")
    known = [s for s in segments if not s.get("unknown")]
    if any(s.get("to_step") is None for s in known):
        reasons.append("its training has not ended (no check of its code at the end)")
    if any(s.get("git_dirty") for s in known):
        reasons.append("trained with uncommitted changes")
    if any(s.get("git_dirty") is None for s in known):
        reasons.append("trained outside a git checkout")
    edited = sorted({p for s in known for p in s.get("edited_during_training", [])})
    if edited:
        reasons.append(f"edited during training: {named(edited)}")
    if any(s.get("git_commit") != commit for s in known):
        commits = sorted({str(s.get("git_commit"))[:7] for s in known})
        reasons.append(f"trained at commit {', '.join(commits)}, the report's is {str(commit)[:7]}")
    if record.get("mixed"):
        reasons.append("resumed under other code than it started with")
    source = record.get("init_from")
    if source and not source["imported"]:
        # the weights it started from are part of its numbers: judged by the same rule
        earlier = why_not_reproducible(source["record"], commit)
        reasons += [f"its --init-from run: {reason}" for reason in earlier]
    changed = sorted({p for s in known for p in code_unlike_today(s.get("code", {}))})
    if changed:
        reasons.append(
            f"trained under another code key ({named(changed)} differ from the report's)"
        )
    return reasons
