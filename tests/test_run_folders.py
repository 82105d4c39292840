"""A run never destroys another run: used folders refuse a new run, a lock keeps two runs out of
one folder (and a dead holder's lock is taken over, with a note), resuming past the budget keeps
the records true, a resumed run's metrics have one record per step, and files follow the umask."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import free_port, two_cpu_processes

from shared import checkpoint as ckpt
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.training import cli
from shared.training.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def tiny(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


def start_train(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_records(metrics: Path, count: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {count} metric records in time: {proc.communicate()[1][-2000:]}")


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_new_run_in_a_used_folder_refuses_and_overwrite_moves_the_old_run_aside(
    tmp_path, cache_dir
):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "6", "--eval-every", "3"))
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="already holds a run") as refused:
        cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2"))
    assert f"--resume {out}" in str(refused.value) and "--overwrite" in str(refused.value)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before  # untouched
    summary = cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2", "--overwrite"))
    assert summary["step"] == 2 and summary["best_checkpoint"] is None
    assert [r["step"] for r in records(out) if r["kind"] == "train"] == [2]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]
    (aside,) = tmp_path.glob("run.replaced-*")
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == before


def test_out_naming_a_file_or_an_unwritable_place_is_one_line(tmp_path, cache_dir):
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    for out, message in ((a_file, "is a file, not a folder"), (Path("/sys/duolm"), "cannot")):
        done = subprocess.run(
            [sys.executable, "train.py", *tiny(out, cache_dir, "--max-steps", "1")],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.serial
def test_a_second_run_on_a_locked_folder_exits_at_once_and_the_first_finishes(tmp_path, cache_dir):
    out = tmp_path / "run"
    first = start_train(
        *tiny(
            out, cache_dir, "--max-steps", "100000", "--log-every", "1", "--eval-every", "100000"
        ),
        "--checkpoint-every",
        "2",
    )
    try:
        wait_for_records(out / "metrics.jsonl", 3, first)  # so a checkpoint exists to resume
        requeued = ["--resume", "auto", "--out", str(out), "--cache-dir", str(cache_dir)]
        for argv in (tiny(out, cache_dir, "--seed", "1"), ["--resume", str(out)], requeued):
            second = subprocess.run(
                [sys.executable, "train.py", *argv], cwd=ROOT, capture_output=True, text=True
            )
            assert second.returncode == 2, second.stderr
            assert f"in use by another run (PID {first.pid} on host" in second.stderr
            assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 75, err[-2000:]  # stopped by SIGTERM, saved: requeue
    summary = json.loads((out / "final.json").read_text())
    newest = ckpt.list_checkpoints(out / "checkpoints")[-1]
    assert newest.name == ckpt.checkpoint_name(summary["step"])
    ckpt.verify_checkpoint(newest)
    assert all(r["step"] <= summary["step"] for r in records(out))


@pytest.mark.serial
def test_a_stale_lock_of_a_killed_run_is_reported_and_taken_over(tmp_path, cache_dir):
    out = tmp_path / "run"
    proc = start_train(
        *tiny(out, cache_dir, "--max-steps", "100000", "--log-every", "1", "--eval-every", "3")
    )
    wait_for_records(out / "metrics.jsonl", 8, proc)
    proc.kill()
    proc.communicate(timeout=60)
    resumed = subprocess.run(
        [sys.executable, "train.py", "--resume", str(out), "--stop-after-steps", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"PID {proc.pid}" in resumed.stdout + resumed.stderr
    assert "stale" in resumed.stdout + resumed.stderr


def test_resuming_to_a_budget_already_passed_refuses_and_keeps_the_records(tmp_path, cache_dir):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "8", "--eval-every", "4"))
    final = (out / "final.json").read_text()
    with pytest.raises(ConfigError, match="step 8.*budget of 4 steps"):
        cli.train_from_argv(["--resume", str(out), "--max-steps", "4"])
    assert (out / "final.json").read_text() == final
    with pytest.raises(ConfigError, match="already finished its budget of 8 steps"):
        cli.train_from_argv(["--resume", str(out)])  # the same budget: nothing to do
    assert (out / "final.json").read_text() == final


def test_a_resumed_run_has_one_metric_record_per_step(tmp_path, cache_dir):
    out = tmp_path / "run"
    cli.train_from_argv(
        tiny(out, cache_dir, "--max-steps", "8", "--eval-every", "4", "--log-every", "1")
    )
    # As after kill -9 between the step-8 records and its checkpoint: the newest checkpoint is
    # step 4, the records go on to step 8.
    for path in ckpt.list_checkpoints(out / "checkpoints"):
        if path.name != "step_000004":
            shutil.rmtree(path)
    (out / "final.json").unlink()
    cli.train_from_argv(["--resume", str(out)])
    steps = [r["step"] for r in records(out) if r["kind"] == "train"]
    assert steps == list(range(1, 9))


def test_checkpoints_follow_the_umask(tmp_path, cache_dir):
    old = os.umask(0o022)
    try:
        cli.train_from_argv(tiny(tmp_path / "run", cache_dir, "--max-steps", "1"))
    finally:
        os.umask(old)
    newest = ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    assert newest.stat().st_mode & 0o777 == 0o755
    for path in newest.rglob("*"):
        expected = 0o755 if path.is_dir() else 0o644
        assert path.stat().st_mode & 0o777 == expected, path


def test_every_flag_has_a_group_and_a_description():
    described = {name for group in cli.FLAG_GROUPS.values() for name in group}
    fields = {f.name for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)}
    assert described == fields - {"vocab_size"}
    usage = cli.build_parser(None).format_help()
    assert "budget (defaults shown are the preset's)" in usage
    assert "ar | mdm | bd (block diffusion)" in usage


@pytest.mark.multiprocess
@pytest.mark.serial
def test_a_refusal_under_accelerate_launch_is_printed_once_and_stops_every_process(
    tmp_path, cache_dir
):
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2", "--eval-every", "100"))
    done = subprocess.run(
        [
            *two_cpu_processes(port=free_port()),
            "train.py",
            *tiny(out, cache_dir, "--max-steps", "4"),
        ],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "already holds a run" in errors[0], done.stderr[-3000:]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]
