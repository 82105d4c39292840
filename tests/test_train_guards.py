"""train.py keeps what it did not create and writes only true numbers: a resume from an older
checkpoint cannot overwrite the run's later ones, a finished run is not resumed at its budget,
tokens/s counts training steps only, a standard error that cannot be measured is null, a second
signal ends even a step that never returns to Python, a folder left by a run that died early says
how to start over, and bad sizes and tokenizer files are one line that blocks no rerun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import copy_of

from shared import checkpoint as ckpt
from shared.errors import CheckpointError, ConfigError
from shared.faults import StopRequest
from shared.training import cli
from shared.training.config import TrainConfig
from shared.training.run_folder import RunFolderLock, mark_folder
from shared.training.setup import unique_rows

ROOT = Path(__file__).resolve().parent.parent


def tiny(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def start_train(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---- data loss ----------------------------------------------------------------------------------


def test_resuming_into_the_run_from_an_older_checkpoint_refuses_and_names_out(tmp_path, cache_dir):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "30", "--eval-every", "10"))
    before = {p.name: (p / "model.safetensors").read_bytes() for p in ckpt.list_checkpoints(out)}
    best = (out / "checkpoints" / "best.json").read_bytes()
    older = out / "checkpoints" / "step_000010"
    with pytest.raises(ConfigError, match="not the newest checkpoint.*step_000020.*--out"):
        cli.train_from_argv(["--resume", str(older), "--max-steps", "40"])
    after = {p.name: (p / "model.safetensors").read_bytes() for p in ckpt.list_checkpoints(out)}
    assert after == before and (out / "checkpoints" / "best.json").read_bytes() == best
    # Branching into a new folder is the way, and leaves the run alone.
    branch = cli.train_from_argv(
        ["--resume", str(older), "--out", str(tmp_path / "branch"), "--max-steps", "20"]
    )
    assert branch["finished"] and branch["step"] == 20
    assert (out / "checkpoints" / "step_000030").is_dir()


def test_resuming_from_an_older_checkpoint_after_a_damaged_newer_one_still_works(
    tmp_path, cache_dir
):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "20", "--eval-every", "10"))
    (out / "checkpoints" / "step_000020" / ckpt.MANIFEST).unlink()  # as after kill -9 mid-write
    (out / "final.json").unlink()
    resumed = cli.train_from_argv(["--resume", str(out / "checkpoints" / "step_000010")])
    assert resumed["finished"] and resumed["step"] == 20


# ---- false numbers ------------------------------------------------------------------------------


def test_throughput_counts_training_steps_only_with_curve_points(tmp_path, cache_dir):
    out = tmp_path / "run"
    flags = ["--max-steps", "24", "--eval-every", "4", "--log-every", "6", "--curve-points", "4"]
    started = time.perf_counter()
    summary = cli.train_from_argv(tiny(out, cache_dir, *flags))
    wall = time.perf_counter() - started
    train = [r for r in records(out) if r["kind"] == "train"]
    tokens_per_step = 8 * 32
    # Every window's tokens are the tokens of its own steps: the windows add up to the run's.
    assert [r["window_tokens"] for r in train] == [6 * tokens_per_step] * 4
    assert sum(r["window_tokens"] for r in train) == summary["tokens_seen"]
    for r in train:
        assert r["tokens_per_s"] == pytest.approx(r["window_tokens"] / r["window_seconds"])
        assert r["mfu"] == pytest.approx(
            r["tokens_per_s"] * summary["flops_per_token"] / summary["peak_flops"]
        )
    # The windows' time is training time: less than the run's wall time, which also validated
    # and saved a checkpoint six times.
    assert sum(r["window_seconds"] for r in train) < wall


def test_resuming_a_finished_run_at_its_budget_refuses_and_keeps_its_records(tmp_path, cache_dir):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "8", "--eval-every", "4"))
    final, metrics = (out / "final.json").read_text(), (out / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already finished its budget of 8 steps"):
        cli.train_from_argv(["--resume", str(out)])
    assert (out / "final.json").read_text() == final
    assert (out / "metrics.jsonl").read_text() == metrics


def test_a_refused_resume_writes_nothing(tmp_path, cache_dir):
    # every check of a resume runs before its first write: config.json, metrics and the
    # checkpoints stay byte for byte as they were, whichever check refuses
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "4", "--eval-every", "100"))

    def contents():
        return {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}

    before = contents()
    refusals = {
        ("--preset", "demo"): "preset",
        ("--objective", "mdm"): "objective",
        ("--dataset", "shakespeare"): "dataset",
        ("--lr", "nan"): "lr=nan",
        ("--max-steps", "3"): "past this run's budget",
    }
    for flags, named in refusals.items():
        with pytest.raises((ConfigError, CheckpointError), match=named):
            cli.train_from_argv(["--resume", str(out), "--max-steps", "8", *flags])
        assert contents() == before, flags
    # a resume that goes ahead records the run's own preset, not the flag's default
    cli.train_from_argv(["--resume", str(out), "--max-steps", "6"])
    assert json.loads((out / "config.json").read_text())["preset"] == "tiny"


def files_of(run: Path) -> dict[str, bytes | tuple[int, int]]:
    """Every file of ``run`` but its lock: its bytes, or (size, mtime) for one of over 1 MiB (a
    sparse metrics file of 5 GB is never read here)."""
    return {
        str(path.relative_to(run)): path.read_bytes()
        if path.stat().st_size <= 1 << 20
        else (path.stat().st_size, path.stat().st_mtime_ns)
        for path in run.rglob("*")
        if path.is_file() and path.name != ".lock"
    }


def best_without_step(run: Path) -> None:
    (run / "checkpoints" / "best.json").write_text('{"val_nats_per_token": 5.0}')


def metrics_line_damaged(run: Path) -> None:
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 1, "kin\n{"step": 2}\n')


def metrics_a_folder(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()


def metrics_of_five_sparse_gigabytes(run: Path) -> None:
    os.truncate(run / "metrics.jsonl", 5 << 30)  # zeros after the records, on no disk


@pytest.mark.parametrize(
    "damage, said",
    [
        (best_without_step, 'checkpoints/best.json: "step" is missing; it must be a whole number'),
        (metrics_line_damaged, "metrics.jsonl line 2: not JSON"),
        (metrics_a_folder, "metrics.jsonl is a folder, not a regular file"),
        (
            metrics_of_five_sparse_gigabytes,
            "longer than 1,048,576 bytes, which no metrics record is",
        ),
    ],
)
def test_a_resume_refused_by_its_records_leaves_every_file_as_it_was(
    tiny_run, cache_dir, tmp_path, capsys, damage, said
):
    # the records a resume reads (best.json, metrics.jsonl) are checked before config.json,
    # which this resume would change (max_steps 2 -> 40), is written; a metrics file is read
    # a line at a time, so 5 GB of zeros is one refused line, not 5 GB of memory
    run = copy_of(tiny_run, tmp_path)
    damage(run)
    before = files_of(run)
    status = cli.main(["--resume", str(run), "--max-steps", "40", "--cache-dir", str(cache_dir)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert lines[-1].startswith("error: ") and said in lines[-1], lines[-1]
    assert files_of(run) == before


def test_a_run_killed_before_its_final_validation_resumes_to_it_with_its_throughput(
    tmp_path, cache_dir
):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "8", "--eval-every", "4"))
    (out / "final.json").unlink()  # killed after the last checkpoint, before final.json
    summary = cli.train_from_argv(["--resume", str(out)])
    assert summary["finished"] and summary["step"] == 8
    assert summary["train_tokens_per_s"] > 0  # from the records of the steps trained before


def test_one_validation_row_writes_a_null_standard_error_and_warns(tmp_path, cache_dir, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("In the beginning God created the heaven and the earth. " * 40)
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("Amen.")
    out = tmp_path / "run"
    summary = cli.train_from_argv(
        tiny(out, cache_dir, "--dataset", str(corpus), "--val-dataset", str(held_out))
        + ["--max-steps", "4", "--eval-every", "2"]
    )
    assert summary["val_nats_per_token_se"] is None
    text = (out / "final.json").read_text() + (out / "metrics.jsonl").read_text()
    assert "NaN" not in text
    json.loads((out / "final.json").read_text(), parse_constant=pytest.fail)
    assert "validation split has 1 row" in capsys.readouterr().out


# ---- stops --------------------------------------------------------------------------------------


@pytest.mark.serial
def test_a_second_sigterm_ends_a_step_that_never_returns_to_python(tmp_path, cache_dir):
    out = tmp_path / "run"
    proc = start_train(
        *tiny(out, cache_dir, "--max-steps", "5"), env={"DUOLM_FAULTS": "stall_in_step@1"}
    )
    # The stalled step starts after setup, which writes config.json first.
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "config.json").exists():
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    time.sleep(StopRequest.REPEAT_WINDOW_S + 0.5)  # a repeat inside the window is one request
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)  # the stall itself runs for minutes
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the second SIGTERM did not end the process") from None
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "SIGTERM received" in err and "again: exiting now" in err


@pytest.mark.serial
def test_a_signal_during_start_up_is_said_not_silent(tmp_path, cache_dir):
    """SIGTERM while train.py is still importing (or checking its flags) exits 143 with a line
    saying no step was interrupted; if it lands once the run holds the signals, the run stops
    at its first step instead. Either way the process says what happened."""
    proc = start_train(*tiny(tmp_path / "run", cache_dir, "--max-steps", "5"))
    wait_for_sigterm_handler(proc.pid)  # installed before the seconds-long imports
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 128 + signal.SIGTERM:
        assert "stopped by SIGTERM outside the training steps" in err
    else:
        assert proc.returncode == 75 and "stopped by SIGTERM" in out + err


def wait_for_sigterm_handler(pid: int, timeout: float = 60.0) -> None:
    """Until process ``pid`` catches SIGTERM (its SigCgt mask in /proc, on Linux); elsewhere a
    fixed second."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        time.sleep(1.0)
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        caught = [line for line in status.read_text().splitlines() if line.startswith("SigCgt:")]
        if caught and int(caught[0].split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.01)


@pytest.mark.serial
def test_the_start_up_handler_exits_with_the_signal_code(capsys):
    sys.path.insert(0, str(ROOT))
    try:
        import train as entry
    finally:
        sys.path.remove(str(ROOT))
    with pytest.raises(SystemExit) as stopped:
        entry.stop_outside_training(signal.SIGINT, None)
    assert stopped.value.code == 128 + signal.SIGINT
    assert "stopped by SIGINT outside the training steps" in capsys.readouterr().err


def test_a_step_far_beyond_the_machine_is_announced(tmp_path, cache_dir, capsys):
    from shared.training.guards import warn_if_slow

    said = []
    warn_if_slow(flops_per_step=1e15, peak=1e11, steps=10, log=said.append)
    assert len(said) == 1 and "at least 167 min" in said[0] and "27.8 h" in said[0]
    warn_if_slow(flops_per_step=1e9, peak=1e11, steps=10, log=said.append)
    assert len(said) == 1


def test_a_folder_left_before_the_first_checkpoint_names_overwrite(tmp_path, cache_dir):
    out = tmp_path / "run"
    out.mkdir()
    # a run that died during its first step: its config.json and nothing else
    (out / "config.json").write_text('{"model_config": {}, "train_config": {}}')
    mark_folder(out, "run")
    with pytest.raises(ConfigError, match="before its first checkpoint.*--overwrite"):
        cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2"))
    with pytest.raises(CheckpointError, match="nothing to resume.*--overwrite"):
        cli.train_from_argv(["--resume", str(out)])
    summary = cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2", "--overwrite"))
    assert summary["finished"]


@pytest.mark.serial
def test_resume_on_a_locked_folder_without_checkpoints_says_in_use(tmp_path):
    out = tmp_path / "run"
    lock = RunFolderLock(out).acquire()
    try:
        with pytest.raises(ConfigError, match="in use by another run"):
            cli.train_from_argv(["--resume", str(out)])
    finally:
        lock.release()


def test_resume_with_overwrite_refuses(tmp_path, cache_dir):
    out = tmp_path / "run"
    cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2"))
    with pytest.raises(ConfigError, match="--resume and --overwrite do not go together"):
        cli.train_from_argv(["--resume", str(out), "--overwrite", "--max-steps", "4"])


# ---- tracebacks ---------------------------------------------------------------------------------


@pytest.mark.serial
def test_a_batch_beyond_the_machine_is_refused_before_anything_is_written(tmp_path, cache_dir):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="needs at least .* GiB.*--batch-size"):
        cli.train_from_argv(tiny(out, cache_dir, "--batch-size", "1000000000"))
    assert not (out / "config.json").exists()


@pytest.mark.serial
def test_running_out_of_memory_in_a_step_is_one_line_and_blocks_no_rerun(tmp_path, cache_dir):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", *tiny(out, cache_dir, "--max-steps", "2")],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DUOLM_FAULTS": "oom_in_step@1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: out of memory") and "--batch-size" in last
    # Nothing of the failed run blocks the same command.
    summary = cli.train_from_argv(tiny(out, cache_dir, "--max-steps", "2"))
    assert summary["finished"]


@pytest.mark.parametrize(
    "content", ["", "just some text\n", json.dumps({"not": "a tokenizer"})], ids=str
)
def test_a_tokenizer_file_that_is_not_one_is_one_line(content, tmp_path, cache_dir):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match="not a tokenizer.json file"):
        cli.train_from_argv(tiny(tmp_path / "run", cache_dir, "--tokenizer", f"hf:{bad}"))


# ---- smaller ------------------------------------------------------------------------------------


def test_a_negative_seed_names_the_flag(tmp_path, cache_dir):
    with pytest.raises(ConfigError, match="seed=-1 must be >= 0"):
        cli.train_from_argv(tiny(tmp_path / "run", cache_dir, "--seed", "-1"))


def test_fp32_is_called_fp32_and_a_cut_unique_token_count_is_said(tmp_path, cache_dir, capsys):
    out = tmp_path / "run"
    summary = cli.train_from_argv(
        tiny(out, cache_dir, "--max-steps", "2", "--unique-tokens", "10", "--precision", "fp32")
    )
    said = capsys.readouterr().out
    assert summary["precision"] == "fp32" and "precision fp32" in said
    assert "unique_tokens=10 keeps 1 whole row(s) of 31 training tokens: 31 unique" in said


def test_unique_rows_random_draws_over_the_whole_split_with_one_fixed_seed():
    rows = np.arange(100 * 4).reshape(100, 4)  # row i starts with 4 i
    first = unique_rows(rows, TrainConfig(seq_len=4, unique_tokens=30))
    assert first.tolist() == rows[:10].tolist()
    spread = TrainConfig(seq_len=4, unique_tokens=30, unique_sample="random")
    drawn = unique_rows(rows, spread)
    starts = (drawn[:, 0] // 4).tolist()
    assert len(starts) == 10 and starts == sorted(starts) and len(set(starts)) == 10
    assert max(starts) > 50  # from across the split, not its start
    # the same rows for every run (the training seed does not enter)
    assert (
        unique_rows(
            rows, TrainConfig(seq_len=4, unique_tokens=30, unique_sample="random", seed=7)
        ).tolist()
        == drawn.tolist()
    )
    with pytest.raises(ConfigError, match="unique_sample"):
        TrainConfig(unique_sample="middle").validate()
