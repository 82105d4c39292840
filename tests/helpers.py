"""Helpers several test modules use on a run they were given: a writable copy of it (or of one
checkpoint, as a run of its own), and a checkpoint manifest rewritten after a test changed the
checkpoint's files."""

import json
import shutil
from pathlib import Path

from shared import checkpoint as ckpt


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of ``run`` under ``tmp_path`` that a test may change (its lock left behind)."""
    return Path(shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns(".lock")))


def relist(checkpoint: Path, removed: tuple[str, ...] = ()) -> None:
    """Rewrite the manifest as whoever crafted the checkpoint would: every file there (less
    ``removed``, deleted first), with its checksum."""
    for name in removed:
        (checkpoint / name).unlink()
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != ckpt.MANIFEST)
    manifest = {str(p.relative_to(checkpoint)): ckpt.file_sha256(p) for p in files}
    (checkpoint / ckpt.MANIFEST).write_text(json.dumps(manifest, indent=2))


def checkpoint_in_a_run(checkpoint: Path, tmp_path: Path) -> Path:
    """A copy of ``checkpoint`` as the one checkpoint of a run folder in ``tmp_path``."""
    copy = tmp_path / "run" / "checkpoints" / checkpoint.name
    shutil.copytree(checkpoint, copy)
    return copy
