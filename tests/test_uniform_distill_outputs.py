"""``duolm distill`` writes as every other writer does: it locks its output folder before the
teacher loads, refuses a live run's folder, a folder inside a running compare, a run's
``checkpoints/`` and a folder it cannot write (at once, not after the distillation), makes its
folders and files with the modes the umask gives, tokenizes into ``--cache-dir`` or duolm's
cache (never the folder a received run's state names), and leaves nothing behind when the disk
fills while it writes.

Every test works inside its tmp path, with HOME and DUOLM_CACHE pointed there."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
from safetensors import SafetensorError

from dllm.uniform import distill
from shared import checkpoint as ckpt
from shared.training import run_folder
from shared.training.run_folder import mark_folder

pytestmark = pytest.mark.usefixtures("private_home")

FAST = ["--rounds", "1", "--steps-per-round", "1", "--base-steps", "8"]


@pytest.fixture(scope="module")
def udm_run_from_another_machine(tmp_path_factory) -> Path:
    """A tiny udm run (2 steps) whose state names its own cache folder, as a run received from
    another machine names one of that machine's."""
    from shared.training import cli

    root = tmp_path_factory.mktemp("distill5")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root / "home"))
        cli.train_from_argv(
            ["--preset", "tiny", "--objective", "udm", "--out", str(root / "udm")]
            + ["--cache-dir", str(root / "their-cache"), "--eval-every", "100", "--max-steps", "2"]
        )
    return root / "udm"


@pytest.fixture()
def no_teacher(monkeypatch):
    """Fail the test if the teacher is loaded: a refusal must come before it."""

    def loaded(*args, **kwargs):
        raise AssertionError("the teacher was loaded before the output folder was checked")

    monkeypatch.setattr(ckpt, "load_model_from_checkpoint", loaded)


def run_distill(
    udm_run_from_another_machine: Path, out: Path, *flags: str, cache: Path | None = None
) -> int:
    argv = [str(udm_run_from_another_machine), str(out), *FAST, *flags]
    if cache is not None:
        argv += ["--cache-dir", str(cache)]
    return distill.main(argv)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# The lock another process holds (a live run, a running compare): a flock on <folder>/.lock
# with its owner's record, as RunFolderLock writes it.
HOLDER = """
import fcntl, json, os, sys, time
handle = open(os.path.join(sys.argv[1], ".lock"), "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
handle.write(json.dumps({"pid": os.getpid(), "host": "elsewhere", "since": "now"}))
handle.flush()
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture()
def locked_by_another():
    """``lock(folder)``: another process holds ``folder``'s lock until the test ends."""
    holders = []

    def lock(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True
        )
        holders.append(holder)
        assert holder.stdout.readline().strip() == "locked"

    yield lock
    for holder in holders:
        holder.kill()
        holder.wait()


def test_a_live_runs_folder_is_refused_before_the_teacher_loads(
    tmp_path, capsys, locked_by_another, no_teacher, udm_run_from_another_machine
):
    live = tmp_path / "live"
    locked_by_another(live)
    (live / "metrics.jsonl").write_text('{"step": 1}\n')
    assert run_distill(udm_run_from_another_machine, live) == 2
    assert "is in use by a run (PID" in one_error_line(capsys)
    assert sorted(p.name for p in live.iterdir()) == [".lock", "metrics.jsonl"]


def test_a_folder_inside_a_running_compare_is_refused(
    tmp_path, capsys, locked_by_another, no_teacher, udm_run_from_another_machine
):
    job = tmp_path / "compare-job"
    locked_by_another(job)
    (job / "stages").mkdir()
    for out in (job, job / "student"):
        assert run_distill(udm_run_from_another_machine, out) == 2
        line = one_error_line(capsys)
        assert "in use by a run" in line, line
    assert not (job / "student").exists()


def test_a_runs_checkpoints_folder_is_refused(
    tmp_path, capsys, no_teacher, udm_run_from_another_machine
):
    other = tmp_path / "other-run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "metrics.jsonl").write_text('{"step": 1}\n')
    mark_folder(other, "run")
    for out in (other / "checkpoints", other / "checkpoints" / "student"):
        assert run_distill(udm_run_from_another_machine, out) == 2
        assert "inside the checkpoints of the run" in one_error_line(capsys)
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == []


def test_an_unwritable_output_is_refused_at_once(
    tmp_path, capsys, no_teacher, udm_run_from_another_machine
):
    # A regular file where a folder must go: mkdir fails as it does on /proc or a read-only mount.
    (tmp_path / "a-file").write_text("x")
    assert run_distill(udm_run_from_another_machine, tmp_path / "a-file" / "student") == 2
    assert "cannot write to the run folder" in one_error_line(capsys)
    assert run_distill(udm_run_from_another_machine, tmp_path / "a-file") == 2
    assert "is a file" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_output_is_locked_while_it_distils_and_the_cache_is_never_the_runs(
    tmp_path, monkeypatch, udm_run_from_another_machine
):
    seen = {}
    tokenize = distill.tokenize_corpus

    def watching(*args, cache_dir, **kwargs):
        seen["cache_dir"] = Path(cache_dir)
        seen["holder"] = run_folder.lock_holder(out)
        return tokenize(*args, cache_dir=cache_dir, **kwargs)

    monkeypatch.setattr(distill, "tokenize_corpus", watching)
    out = tmp_path / "student"
    their_state = ckpt.read_state(ckpt.resolve_checkpoint(udm_run_from_another_machine))
    assert Path(their_state["train_config"]["cache_dir"]).name == "their-cache"
    assert run_distill(udm_run_from_another_machine, out) == 0
    assert seen["cache_dir"] == tmp_path / "cache"  # $DUOLM_CACHE, not the run's
    assert seen["holder"]["pid"] == os.getpid()  # locked from before the data and teacher
    assert run_folder.lock_holder(out) is None
    assert (
        run_distill(udm_run_from_another_machine, tmp_path / "student2", cache=tmp_path / "mine")
        == 0
    )
    assert seen["cache_dir"] == tmp_path / "mine"
    assert (tmp_path / "mine" / "tokenized").is_dir()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_folders_and_files_follow_the_umask(tmp_path, udm_run_from_another_machine, umask):
    previous = os.umask(umask)
    try:
        assert run_distill(udm_run_from_another_machine, tmp_path / "new" / "student") == 0
    finally:
        os.umask(previous)
    out = tmp_path / "new" / "student"
    for path in [out.parent, out, *out.rglob("*")]:
        wanted = (0o777 if path.is_dir() else 0o666) & ~umask
        assert path.stat().st_mode & 0o777 == wanted, (path, oct(path.stat().st_mode))
    assert ckpt.read_state(ckpt.resolve_checkpoint(out))["distilled"]["rounds"] == 1


def test_a_used_folder_needs_overwrite_which_moves_it_aside(
    tmp_path, capsys, udm_run_from_another_machine
):
    out = tmp_path / "student"
    assert run_distill(udm_run_from_another_machine, out) == 0
    capsys.readouterr()
    assert run_distill(udm_run_from_another_machine, out) == 2
    assert "already holds a training run; distill into a new folder" in one_error_line(capsys)
    assert run_distill(udm_run_from_another_machine, out, "--overwrite") == 0
    assert "moved what was in" in capsys.readouterr().out
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("student.replaced-")]
    assert len(aside) == 1 and ckpt.list_checkpoints(aside[0] / "checkpoints")
    # the run it distils is never moved aside
    assert (
        run_distill(udm_run_from_another_machine, udm_run_from_another_machine, "--overwrite") == 2
    )
    assert "or inside it" in one_error_line(capsys)


def disk_full(*args, **kwargs):
    raise SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28) at path "
        f'"{Path(args[1]).parent / ".tmpXYZ"}"'
    )


@pytest.mark.parametrize("made_before", [False, True])
def test_a_full_disk_leaves_no_student_and_says_where(
    tmp_path, capsys, monkeypatch, udm_run_from_another_machine, made_before
):
    out = tmp_path / "student"
    if made_before:
        out.mkdir()
    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    assert run_distill(udm_run_from_another_machine, out) == 2
    line = one_error_line(capsys)
    assert "No space left on device writing" in line and "model.safetensors" in line, line
    assert " free of " in line and f"on {tmp_path}" in line, line
    # only what distill made goes: an empty folder that was there stays, without a lock file
    assert (out.is_dir() and not any(out.iterdir())) if made_before else not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"] + ["student"] * made_before


def test_a_read_only_output_is_one_line(
    tmp_path, capsys, monkeypatch, udm_run_from_another_machine
):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "student"))

    monkeypatch.setattr(distill, "write_atomic", read_only)
    assert run_distill(udm_run_from_another_machine, tmp_path / "student") == 2
    assert "Read-only file system writing" in one_error_line(capsys)
    assert not (tmp_path / "student").exists()
    assert json.loads(
        (udm_run_from_another_machine / "config.json").read_text()
    )  # the run it read is untouched
