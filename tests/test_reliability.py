"""Faults cost nothing that cannot be recovered: kills, signals, corrupt files, NaNs, bad input."""

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launch import free_port, two_cpu_processes
from safetensors.torch import load_file

from shared import checkpoint as ckpt
from shared import faults
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.training import cli, presets
from shared.training.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def inject(monkeypatch):
    """Set DUOLM_FAULTS for an in-process run (the parsed spec is cached, so reset it)."""

    def set_faults(spec: str) -> None:
        monkeypatch.setenv("DUOLM_FAULTS", spec)
        faults._faults.cache_clear()

    yield set_faults
    faults._faults.cache_clear()


def tiny(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


def run_train(*args: str, env_extra: dict | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def newest_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.list_checkpoints(out / "checkpoints")[-1] / "model.safetensors"))


@pytest.mark.serial
def test_kill_during_checkpoint_write_then_resume_matches_uninterrupted(tmp_path, cache_dir):
    common = ["--objective", "mdm", "--max-steps", "24", "--eval-every", "6"]
    straight = tmp_path / "straight"
    cli.train_from_argv(tiny(straight, cache_dir, *common))

    crashed = tmp_path / "crashed"
    proc = run_train(
        *tiny(crashed, cache_dir, *common), env_extra={"DUOLM_FAULTS": "kill_in_checkpoint@12"}
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    # The kill hit between the weights and the manifest of step 12: only step 6 is complete.
    assert [p.name for p in ckpt.list_checkpoints(crashed / "checkpoints")] == ["step_000006"]
    assert list((crashed / "checkpoints").glob(".step_000012.*")), "the staging dir is left over"

    resumed = cli.train_from_argv(["--resume", str(crashed), "--cache-dir", str(cache_dir)])
    assert resumed["finished"] and resumed["step"] == 24
    assert not list((crashed / "checkpoints").glob(".step_*")), "stale staging dirs are cleaned"
    a, b = newest_weights(straight), newest_weights(crashed)
    assert all(torch.equal(a[name], b[name]) for name in a)


def signal_now(signum: int):
    """A stand-in for a writer's last step that sends this process ``signum`` half-way through
    the write (a real signal, through the handlers the writer installed)."""

    def send(*args, **kwargs):
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.SIG_IGN, None):
            # sent anyway, it would end the test process with the folder half-written
            raise AssertionError(f"the writer takes no {signal.Signals(signum).name}")
        os.kill(os.getpid(), signum)
        time.sleep(30)  # the handler leaves the sleep at once
        raise AssertionError(f"{signal.Signals(signum).name} did not stop the writer")

    return send


REMOVED = "nothing of it was left; run the same command again"
SHARD_ARGS = ["--data", "synthetic:hmm?seed=1&n=2000", "--seq-len", "16", "--shard-tokens", "64"]


@pytest.mark.parametrize(
    "signum, status, said",
    [
        (signal.SIGTERM, 75, "stopped by SIGTERM while writing {out}: " + REMOVED),
        (signal.SIGUSR1, 75, "stopped by SIGUSR1 while writing {out}: " + REMOVED),
        (signal.SIGINT, 130, "stopped by Ctrl-C (SIGINT)"),
    ],
)
def test_a_signal_during_shard_data_removes_what_it_wrote_so_the_rerun_works(
    tmp_path, capsys, monkeypatch, signum, status, said
):
    from shared.data import shard_command

    # every shard and the manifest are written; the signal comes before the folder's marker
    monkeypatch.setattr(shard_command, "mark_folder", signal_now(signum))
    out = tmp_path / "shards"
    assert shard_command.main([*SHARD_ARGS, "--out", str(out)]) == status
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: " + said.format(out=out)
    assert not out.exists()
    monkeypatch.undo()
    assert shard_command.main([*SHARD_ARGS, "--out", str(out)]) == 0


def test_sigterm_during_an_export_removes_what_it_wrote_so_the_rerun_works(
    tiny_run, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("transformers")
    from dllm import export
    from eval import cli as duolm

    # the weights, config and tokenizer are written; SIGTERM comes before the folder's marker
    monkeypatch.setattr(export, "mark_folder", signal_now(signal.SIGTERM))
    out = tmp_path / "export"
    out.mkdir()  # a folder that was there before stays, empty
    assert duolm.main(["export", str(tiny_run), str(out)]) == 75
    said = f"error: stopped by SIGTERM while writing {out}: nothing of it was left"
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(said)
    assert list(out.iterdir()) == []
    monkeypatch.undo()
    assert duolm.main(["export", str(tiny_run), str(out)]) == 0
    assert (out / "model.safetensors").is_file()


@pytest.mark.serial
def test_sigterm_saves_the_step_reached_and_exits_with_the_requeue_status(tmp_path, cache_dir):
    out = tmp_path / "run"
    proc = run_train(
        *tiny(out, cache_dir, "--max-steps", "100000", "--log-every", "1", "--eval-every", "100000")
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-2000:]  # saved and stopped: a job script may requeue
    summary = json.loads((out / "final.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and not summary["finished"]
    last_logged = [json.loads(line) for line in metrics.read_text().splitlines()][-1]["step"]
    assert summary["step"] == last_logged >= 5
    newest = ckpt.list_checkpoints(out / "checkpoints")[-1]
    assert newest.name == ckpt.checkpoint_name(summary["step"])
    ckpt.verify_checkpoint(newest)
    assert "SIGTERM received" in err


@pytest.mark.serial
def test_second_signal_exits_at_once(monkeypatch):
    request = faults.StopRequest()
    exits = []
    monkeypatch.setattr(faults.os, "_exit", lambda status: exits.append(status))
    try:
        assert signal.getsignal(signal.SIGINT) == request._handle
        request.received(signal.SIGINT)
        assert request.requested and request.signal_name == "SIGINT" and not exits
        request.received(signal.SIGINT)
        assert exits == [128 + signal.SIGINT]
    finally:
        request.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.serial
def test_a_scheduler_signal_repeated_within_the_window_is_one_request(monkeypatch):
    """srun and torchrun may both pass one SIGTERM on: a repeat within the window is the same
    request (the run still saves and exits 75); one after the window exits at once."""
    request = faults.StopRequest()
    exits, clock = [], [100.0]
    monkeypatch.setattr(faults.os, "_exit", lambda status: exits.append(status))
    monkeypatch.setattr(faults.time, "monotonic", lambda: clock[0])
    try:
        request.received(signal.SIGTERM)
        clock[0] += request.REPEAT_WINDOW_S / 2
        request.received(signal.SIGTERM)
        assert request.signal_name == "SIGTERM" and not exits
        request.received(signal.SIGUSR1)  # another signal is no repeat of this one
        assert exits == [128 + signal.SIGUSR1]
        clock[0] += request.REPEAT_WINDOW_S
        request.received(signal.SIGTERM)
        assert exits == [128 + signal.SIGUSR1, 128 + signal.SIGTERM]
    finally:
        request.close()


@pytest.mark.serial
def test_a_signal_is_noted_by_the_watcher_thread():
    request = faults.StopRequest()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.time() + 10
        while not request.requested and time.time() < deadline:
            time.sleep(0.01)
        assert request.signal_name == "SIGTERM"
    finally:
        request.close()


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "manifest"])
def test_corrupted_checkpoint_is_detected_and_skipped(damage, tmp_path, cache_dir):
    cli.train_from_argv(tiny(tmp_path, cache_dir, "--max-steps", "12", "--eval-every", "6"))
    newest = ckpt.list_checkpoints(tmp_path / "checkpoints")[-1]
    assert newest.name == "step_000012"
    if damage == "truncate":
        weights = newest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "bitflip":
        blob = bytearray((newest / "optimizer.safetensors").read_bytes())
        blob[len(blob) // 2] ^= 0x01
        (newest / "optimizer.safetensors").write_bytes(bytes(blob))
    else:
        (newest / ckpt.MANIFEST).unlink()
    messages = []
    chosen = ckpt.resolve_checkpoint(tmp_path, log=messages.append)
    assert chosen.name == "step_000006"
    assert len(messages) == 1 and "step_000012" in messages[0]
    with pytest.raises(ckpt.CheckpointError):
        ckpt.verify_checkpoint(newest)
    resumed = cli.train_from_argv(["--resume", str(tmp_path), "--cache-dir", str(cache_dir)])
    assert resumed["finished"] and resumed["step"] == 12


def test_nan_steps_are_skipped_and_counted(tmp_path, cache_dir, inject):
    inject("nan_loss@3,4")
    summary = cli.train_from_argv(
        tiny(tmp_path, cache_dir, "--max-steps", "8", "--eval-every", "100")
    )
    assert summary["finished"] and summary["skipped_steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "skipped"] == [3, 4]
    weights = newest_weights(tmp_path)
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_consecutive_nan_steps_stop_the_run_with_a_clear_message(
    tmp_path, cache_dir, inject, capsys
):
    inject("nan_loss@5,6,7")
    args = tiny(
        tmp_path, cache_dir, "--max-steps", "20", "--eval-every", "2", "--max-bad-steps", "3"
    )
    assert cli.main(args) == 3
    message = capsys.readouterr().err
    assert "stopping at step 7" in message and "3 consecutive steps" in message
    assert "last loss nan" in message
    assert "step_000004" in message  # the last checkpoint written before the NaNs


def test_best_checkpoint_is_kept_beyond_keep_last(tmp_path, cache_dir):
    summary = cli.train_from_argv(
        tiny(
            tmp_path,
            cache_dir,
            "--max-steps",
            "40",
            "--eval-every",
            "4",
            "--keep-checkpoints",
            "1",
            "--eval-batches",
            "2",
        )
    )
    best = json.loads((tmp_path / "checkpoints" / ckpt.BEST_FILE).read_text())
    assert summary["best_checkpoint"] == best
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")]
    # Periodic evaluations (same batches each time) pick the best; the last one is at step 36.
    assert best["step"] <= 36
    assert names == [ckpt.checkpoint_name(best["step"]), "step_000040"]


# ---------------------------------------------------------------- property-based input checks

model_fields = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"]
train_fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "cache_dir"]
junk = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.booleans(),
    st.none(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(model_fields + train_fields), value=junk)
def test_config_parser_gives_clear_errors_for_any_value(field, value):
    try:
        presets.resolve_config("tiny", {field: value})
    except ConfigError as error:
        assert field in str(error) or "max_seq_len" in str(error) or "budget" in str(error)


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(model_fields + train_fields),
    text=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=10),
)
def test_cli_parser_gives_clear_errors_for_any_text(field, text):
    flag = "--" + field.replace("_", "-")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _, overrides = cli.parse_args(["--preset", "tiny", flag, text])
        presets.resolve_config("tiny", overrides)
    except SystemExit as exit_:  # argparse: "argument --dim: invalid int value: 'x'"
        assert exit_.code == 2
        assert flag in stderr.getvalue()
    except ConfigError as error:
        assert field in str(error) or "max_seq_len" in str(error) or "budget" in str(error)


@pytest.mark.multiprocess
@pytest.mark.serial
def test_sigterm_to_the_accelerate_launcher_stops_every_process_at_one_step(tmp_path, cache_dir):
    import shutil

    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    launcher = subprocess.Popen(
        [
            *two_cpu_processes(port=free_port()),
            "train.py",
            *tiny(
                out,
                cache_dir,
                "--max-steps",
                "100000",
                "--log-every",
                "1",
                "--eval-every",
                "100000",
            ),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=120)
    # torchrun's launcher reports the signal itself (non-zero); the workers stop cleanly.
    summary = json.loads((out / "final.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["processes"] == 2, err[-6000:]
    newest = ckpt.list_checkpoints(out / "checkpoints")[-1]
    assert newest.name == ckpt.checkpoint_name(summary["step"])
    ckpt.verify_checkpoint(newest)
    resumed = cli.train_from_argv(
        [
            "--resume",
            str(out),
            "--cache-dir",
            str(cache_dir),
            "--max-steps",
            str(summary["step"] + 2),
        ]
    )
    assert resumed["finished"] and resumed["step"] == summary["step"] + 2
