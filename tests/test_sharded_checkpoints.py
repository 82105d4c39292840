"""Sharded checkpoints (torch.distributed.checkpoint) across process counts, preemption with
``--resume auto``, and two "nodes" of two processes on this machine; plus what they refuse.

The multi-process runs are FSDP2 on gloo CPU ranks through ``tests/fsdp_on_cpu.py`` (see
tests/test_fsdp.py); they are marked ``multiprocess`` (a quick loop deselects them with
``-m "not multiprocess"``).
"""

import json
import os
import pickle
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import checkpoint_in_a_run, relist
from launch import FSDP_RUN, cpu_launch_env, free_port, fsdp_command, launch_fsdp
from safetensors.torch import load_file

from shared import checkpoint as ckpt
from shared import sharded_checkpoint as sharded
from shared.errors import CheckpointError
from shared.training import cli, convert
from shared.training.run_folder import RunFolderLock

ROOT = Path(__file__).resolve().parent.parent
COMMON = FSDP_RUN


def launch(out: Path, cache_dir: Path, *extra) -> str:
    return launch_fsdp(out, cache_dir, *extra, port=free_port())


def losses(out: Path) -> dict[int, float]:
    records = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    """The newest checkpoint's weights (a sharded one converted to one file first)."""
    newest = ckpt.list_checkpoints(out / "checkpoints")[-1]
    convert.sharded_to_single(newest)
    return load_file(str(newest / "model.safetensors"))


def assert_close(run: Path, reference: Path) -> None:
    """Equal to ``reference`` within test_fsdp's tolerance (float summation order differs)."""
    ours, theirs = losses(run), losses(reference)
    for step, loss in ours.items():
        assert abs(loss - theirs[step]) < 1e-5 * abs(loss), step
    a, b = final_weights(run), final_weights(reference)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    cli.train_from_argv([*COMMON, "--out", str(out), "--cache-dir", str(cache_dir)])
    return out


@pytest.fixture(scope="module")
def two_halfway(tmp_path_factory, cache_dir) -> Path:
    """A 2-process FSDP run stopped at step 4 with a sharded checkpoint."""
    out = tmp_path_factory.mktemp("two") / "run"
    launch(out, cache_dir, *COMMON, "--checkpoint-format", "sharded", "--stop-after-steps", "4")
    return ckpt.list_checkpoints(out / "checkpoints")[-1]


@pytest.mark.multiprocess
@pytest.mark.serial
@pytest.mark.slow
def test_sharded_checkpoints_resume_on_one_process_and_on_two(
    tmp_path, cache_dir, one_process, two_halfway
):
    # each process wrote its own shards; nothing was gathered into one file
    names = {p.name for p in (two_halfway / "shards").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "index.json"} <= names
    assert not (two_halfway / "model.safetensors").exists()
    ckpt.verify_checkpoint(two_halfway)

    two_then_one = tmp_path / "two_then_one"  # 2 -> 1
    cli.train_from_argv(["--resume", str(two_halfway), "--out", str(two_then_one)])
    assert_close(two_then_one, one_process)

    one_sharded = tmp_path / "one_sharded"  # 1 -> 2
    cli.train_from_argv(
        [*COMMON, "--out", str(one_sharded), "--cache-dir", str(cache_dir)]
        + ["--checkpoint-format", "sharded", "--stop-after-steps", "4"]
    )
    halfway = ckpt.list_checkpoints(one_sharded / "checkpoints")[-1]
    assert (halfway / "shards" / "index.json").is_file()
    one_then_two = tmp_path / "one_then_two"
    output = launch(one_then_two, cache_dir, "--resume", str(halfway), "--log-every", "1")
    assert "(FSDP2)" in output and "resumed from" in output
    assert_close(one_then_two, one_process)


@pytest.mark.multiprocess
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("start", ["fresh", "resumed"])
def test_two_nodes_of_two_processes_train_as_one_process_does(
    tmp_path, cache_dir, one_process, two_halfway, start
):
    """Two launchers (--num_machines 2, --machine_rank 0 and 1, rendezvous on 127.0.0.1) of two
    processes each: a fresh run from step 0, and (2 -> 4) the 2-process sharded checkpoint
    continued; both end where the one-process run does."""
    out = tmp_path / "four"
    port = free_port()
    if start == "fresh":
        extra = (*COMMON, "--checkpoint-format", "sharded")
    else:
        extra = ("--resume", str(two_halfway), "--log-every", "1")
    nodes = [
        subprocess.Popen(
            fsdp_command(out, cache_dir, *extra, port=port, machines=2, rank=rank),
            cwd=ROOT,
            env=cpu_launch_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    summary = json.loads((out / "final.json").read_text())
    assert summary["processes"] == 4 and summary["step"] == 8
    assert min(losses(out)) == (1 if start == "fresh" else 5)
    assert_close(out, one_process)


@pytest.mark.multiprocess
@pytest.mark.serial
@pytest.mark.slow
def test_sigterm_mid_run_then_resume_auto_ends_at_the_uninterrupted_weights(tmp_path, cache_dir):
    straight = tmp_path / "straight"
    launch(straight, cache_dir, *COMMON, "--checkpoint-format", "sharded")

    out = tmp_path / "preempted"
    command = fsdp_command(
        out, cache_dir, *COMMON, "--checkpoint-format", "sharded", port=free_port()
    )
    launcher = subprocess.Popen(
        command,
        cwd=ROOT,
        env=cpu_launch_env(DUOLM_FAULTS="sleep_in_step@3,4,5,6"),  # a window for the signal
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline and not losses_so_far(out):
        time.sleep(0.1)
    launcher.send_signal(signal.SIGTERM)  # torchrun passes it on to both workers
    _, err = launcher.communicate(timeout=120)
    summary = json.loads((out / "final.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["step"] < 8, err[-2000:]
    newest = ckpt.list_checkpoints(out / "checkpoints")[-1]
    assert newest.name == ckpt.checkpoint_name(summary["step"])
    assert ckpt.is_sharded_checkpoint(newest)

    output = launch(out, cache_dir, "--resume", "auto")
    assert f"--resume auto: continuing from {newest}" in output
    a, b = final_weights(out), final_weights(straight)
    for name in b:
        assert torch.equal(a[name], b[name]), name


def losses_so_far(out: Path) -> bool:
    metrics = out / "metrics.jsonl"
    return metrics.exists() and '"kind": "train"' in metrics.read_text()


# ------------------------------------------------------------------ one process: refusals


def test_the_single_file_reader_refuses_a_sharded_checkpoint_and_the_reverse(
    small_sharded, tmp_path, capsys
):
    with pytest.raises(CheckpointError, match="--to single"):
        ckpt.load_model_from_checkpoint(small_sharded)
    copy = checkpoint_in_a_run(small_sharded, tmp_path)
    assert convert.main([str(copy), "--to", "single"]) == 0
    model, _, _ = ckpt.load_model_from_checkpoint(copy)  # reads as one file now
    with pytest.raises(CheckpointError, match="not a sharded checkpoint"):
        sharded.read_index(copy)
    assert convert.main([str(copy), "--to", "single"]) == 0
    assert "already single-file" in capsys.readouterr().out


def test_a_missing_or_truncated_shard_is_refused_in_one_line(small_sharded, tmp_path, capsys):
    missing = checkpoint_in_a_run(small_sharded, tmp_path / "a")
    (missing / "shards" / "__0_0.distcp").unlink()
    truncated = checkpoint_in_a_run(small_sharded, tmp_path / "b")
    shard = truncated / "shards" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    for broken, why in ((missing, "missing file shards/__0_0.distcp"), (truncated, "checksum")):
        assert cli.main(["--resume", str(broken)]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_index_that_unpickles_anything_else_is_refused_and_runs_nothing(
    small_sharded, tmp_path, capsys
):
    """A checkpoint of an earlier version (a pickled index only) is unpickled by
    ``convert-checkpoint --trust`` alone, and even then makes nothing but DCP's index classes."""
    crafted = checkpoint_in_a_run(small_sharded, tmp_path)
    (crafted / "shards" / "index.json").unlink()
    witness = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {witness}",))

    for protocol, why in ((2, "refused to unpickle: it asks for posix.system"), (4, "protocol 4")):
        (crafted / "shards" / ".metadata").write_bytes(pickle.dumps(Payload(), protocol=protocol))
        relist(crafted)
        with pytest.raises(CheckpointError, match="convert-checkpoint .* --trust"):
            sharded.read_index(crafted)
        assert convert.main([str(crafted), "--to", "single"]) == 2
        assert convert.main([str(crafted), "--trust"]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 2, err
    assert not witness.exists()


def test_resume_auto_starts_fresh_then_continues_and_respects_a_live_lock(
    small_sharded, tmp_path, cache_dir, capsys
):
    out = tmp_path / "auto"
    flags = [
        "--preset",
        "tiny",
        "--max-steps",
        "4",
        "--eval-every",
        "2",
        "--cache-dir",
        str(cache_dir),
    ]
    flags += ["--out", str(out), "--stop-after-steps", "2"]
    first = cli.train_from_argv([*flags, "--resume", "auto"])
    assert first["start_step"] == 0 and first["step"] == 2
    assert "no valid checkpoint" in capsys.readouterr().out
    second = cli.train_from_argv([*flags, "--resume", "auto"])
    assert second["start_step"] == 2 and second["step"] == 4

    lock = RunFolderLock(out).acquire()  # another live job holds the folder
    try:
        assert cli.main([*flags, "--resume", "auto"]) == 2
        assert "in use by another run" in capsys.readouterr().err
    finally:
        lock.release()


def test_auto_format_is_sharded_only_under_fsdp_from_the_threshold():
    big = sharded.AUTO_SHARDED_PARAMETERS
    assert sharded.checkpoint_format("auto", "FSDP2", big) == "sharded"
    assert sharded.checkpoint_format("auto", "FSDP2", big - 1) == "single"
    assert sharded.checkpoint_format("auto", "DDP", big) == "single"
    assert sharded.checkpoint_format("single", "FSDP2", big) == "single"
    assert sharded.checkpoint_format("sharded", "single process", 10) == "sharded"
