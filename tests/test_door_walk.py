"""The door's descriptor walk and its hard-link rule (``shared.door_walk``, ``shared.door``):
below a root no folder is reached through a link or a ``..``, folders are made one at a time
through the door, and an in-place write (an append, a lock record) never changes another name
of the same file. Everything here runs in ``tmp_path``."""

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from shared import door
from shared.errors import ConfigError
from shared.training import cli


@pytest.fixture
def roots():
    """Declared roots are per process; a test that declares one forgets it afterwards."""
    yield
    door.forget_declared_roots()


def outside_and_run(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "linked").symlink_to(outside)
    return outside, run


def listing(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text() if p.is_file() else "<folder>"
        for p in sorted(folder.rglob("*"))
    }


def test_no_folder_is_made_or_written_through_a_link_below_the_root(tmp_path):
    outside, run = outside_and_run(tmp_path)
    before = listing(outside)
    attempts = [
        lambda: door.make_folders(run / "linked" / "stages", run),
        lambda: door.write_atomic(run / "linked" / "report.md", "x", root=run),
        lambda: door.write_json_atomic(run / "linked" / "deep" / "a.json", {}, root=run),
        lambda: door.append_line(run / "linked" / "metrics.jsonl", "{}", root=run),
        lambda: door.open_new_file(run / "linked" / "new.bin", run),
    ]
    for attempt in attempts:
        with pytest.raises(ConfigError, match="linked is a symbolic link"):
            attempt()
    assert listing(outside) == before


def test_a_declared_root_guards_calls_that_name_no_root(tmp_path, roots):
    outside, run = outside_and_run(tmp_path)
    before = listing(outside)
    door.declare_root(run)
    for attempt in (
        lambda: door.make_folders(run / "linked" / "seed-0"),
        lambda: door.write_atomic(run / "linked" / "stage.json", "{}"),
        lambda: door.make_temp_folder(run / "linked", ".stage."),
        lambda: door.read_bytes(run / "linked" / "keep.txt"),
        lambda: door.remove_tree(run / "linked" / "keep.txt"),
        lambda: door.rename(run / "linked" / "keep.txt", run / "taken.txt"),
    ):
        with pytest.raises(ConfigError, match="symbolic link"):
            attempt()
    assert listing(outside) == before
    door.make_folders(run / "real" / "seed-0")  # made one folder at a time, below the root
    door.write_atomic(run / "real" / "seed-0" / "a.json", "{}")
    assert (run / "real" / "seed-0" / "a.json").read_text() == "{}"
    door.forget_declared_roots()
    assert door.read_bytes(run / "linked" / "keep.txt") == b"keep me"  # no root: the user's path


def test_a_dotdot_below_the_root_is_refused_not_judged_by_its_letters(tmp_path):
    outside, run = outside_and_run(tmp_path)
    (outside / "sub").mkdir()
    # run/linked/sub/.. is outside/ to the kernel, though its letters say run/linked
    sneaky = run / "linked" / "sub" / ".." / "keep.txt"
    with pytest.raises(ConfigError, match="climbs out with '..'"):
        door.read_bytes(sneaky, run)
    with pytest.raises(ConfigError, match="climbs out with '..'"):
        door.write_atomic(run / "real" / ".." / "x.json", "{}", root=run)
    with pytest.raises(ConfigError, match="lies outside"):
        door.read_bytes(tmp_path / "outside" / "keep.txt", run)


def test_a_root_named_with_dotdot_is_the_users_own_spelling(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "run").mkdir()
    spelled = tmp_path / "a" / ".." / "run"
    door.write_atomic(spelled / "x.json", "{}", root=spelled)
    assert door.read_json_file(spelled / "x.json", root=spelled) == {}


def test_a_folder_below_the_root_that_is_a_file_is_not_a_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "stages").write_text("a file")
    with pytest.raises(ConfigError, match="stages is a file, not a folder"):
        door.make_folders(run / "stages" / "x", run)


def test_reads_count_bytes_rather_than_trusting_a_size(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(ConfigError, match="larger than the 1,000 bytes"):
        door.read_bytes(big, limit=1000)
    assert door.read_bytes(big, limit=1001) == b"x" * 1001


# ------------------------------------------------------------------------------ hard links


def linked_into_a_run(tmp_path: Path, text: str, name: str) -> tuple[Path, Path]:
    """(a file outside the run holding ``text``, the run folder where ``name`` is a hard link
    to it)."""
    original = tmp_path / "original"
    original.write_text(text)
    run = tmp_path / "run"
    run.mkdir()
    os.link(original, run / name)
    return original, run


def test_an_append_never_changes_another_name_of_the_file(tmp_path):
    original, run = linked_into_a_run(tmp_path, '{"step": 1}\n', "metrics.jsonl")
    door.append_line(run / "metrics.jsonl", '{"step": 2}', root=run)
    assert original.read_text() == '{"step": 1}\n'
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert os.stat(run / "metrics.jsonl").st_nlink == 1 and os.stat(original).st_nlink == 1


def test_a_lock_never_rewrites_another_name_of_its_file(tmp_path):
    original, run = linked_into_a_run(tmp_path, '{"pid": 1}', ".lock")
    handle = door.open_lock_file(run / ".lock")
    door.rewrite_lock_record(handle, "")
    handle.close()
    assert original.read_text() == '{"pid": 1}'
    assert (run / ".lock").read_text() == ""


def test_a_lock_held_on_the_shared_file_stays_held(tmp_path):
    """A snapshot's lock file shares its inode with a live run's: the live holder's lock is
    not broken by the snapshot's opener, which sees the lock taken instead."""
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("")
    held = open(run / ".lock", "r+")  # noqa: SIM115 (held across the check)
    fcntl.flock(held, fcntl.LOCK_EX)
    snap = tmp_path / "snap"
    snap.mkdir()
    os.link(run / ".lock", snap / ".lock")
    handle = door.open_lock_file(snap / ".lock")
    with pytest.raises(BlockingIOError):
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.close()
    held.close()


def fingerprint(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file below ``folder``: its inode and the sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_resuming_a_hard_linked_snapshot_leaves_the_original_run_as_it_was(tmp_path, cache_dir):
    run, snap = tmp_path / "run", tmp_path / "snap"
    flags = ["--preset", "tiny", "--cache-dir", str(cache_dir), "--eval-every", "2"]
    cli.train_from_argv([*flags, "--out", str(run), "--max-steps", "2", "--log-every", "1"])
    subprocess.run(["cp", "-al", str(run), str(snap)], check=True)  # what backup tools make
    before = fingerprint(run)
    cli.train_from_argv(["--resume", str(snap), "--max-steps", "4"])
    assert fingerprint(run) == before
    assert len((snap / "metrics.jsonl").read_text()) > len((run / "metrics.jsonl").read_text())
