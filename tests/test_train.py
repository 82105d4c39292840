"""train.py end to end on the tiny preset: learning, exact resume, 1 vs 2 processes, bad input."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch import free_port, two_cpu_processes
from safetensors.torch import load_file

from shared.checkpoint import list_checkpoints
from shared.errors import ConfigError
from shared.training import cli, presets, resume, schedule

ROOT = Path(__file__).resolve().parent.parent


def tiny_args(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--cache-dir", str(cache), *extra]


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(list_checkpoints(out / "checkpoints")[-1] / "model.safetensors"))


def test_validation_scores_at_most_val_max_rows_rows(tmp_path, cache_dir):
    # the tiny preset keeps the first 256 rows of 31 loss tokens; 0 keeps the whole split
    common = ["--max-steps", "1", "--eval-every", "100"]
    kept = cli.train_from_argv(tiny_args(tmp_path / "kept", cache_dir, *common))
    assert kept["val_tokens"] == 256 * 31
    every = cli.train_from_argv(
        tiny_args(tmp_path / "all", cache_dir, *common, "--val-max-rows", "0")
    )
    assert every["val_tokens"] > 20 * kept["val_tokens"]  # 5,186 rows
    with pytest.raises(ConfigError, match="val_max_rows=-1 must be >= 0"):
        cli.train_from_argv(tiny_args(tmp_path / "bad", cache_dir, "--val-max-rows", "-1"))


@pytest.mark.parametrize("objective", ["ar", "mdm", "udm"])
def test_loss_falls_on_a_tiny_corpus(objective, tmp_path, cache_dir):
    summary = cli.train_from_argv(
        tiny_args(
            tmp_path,
            cache_dir,
            "--objective",
            objective,
            "--max-steps",
            "200",
            "--eval-every",
            "100",
            "--log-every",
            "1",
            "--lr",
            "1e-2",
        )
    )
    records = read_metrics(tmp_path)
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert summary["finished"] and summary["step"] == 200
    # Bytes start near uniform (log 258 = 5.55 nats) and must fall well below it.
    assert losses[0] > 5.0
    assert sum(losses[-20:]) / 20 < losses[0] - 2.0
    # Validation over the whole held-out split, far below the uniform model's 5.55 nats.
    assert summary["val_nats_per_token"] < 3.5
    assert summary["metric"] == ("nll" if objective == "ar" else "nelbo")
    assert 0 < summary["val_bpb"] < 8
    assert (tmp_path / "final.json").exists() and (tmp_path / "config.json").exists()


@pytest.mark.parametrize("objective", ["ar", "mdm", "udm"])
def test_resume_is_exact(objective, tmp_path, cache_dir):
    common = [
        "--objective",
        objective,
        "--max-steps",
        "24",
        "--eval-every",
        "8",
        "--warmup-steps",
        "4",
    ]
    straight, split = tmp_path / "straight", tmp_path / "split"
    cli.train_from_argv(tiny_args(straight, cache_dir, *common))
    first = cli.train_from_argv(tiny_args(split, cache_dir, *common, "--stop-after-steps", "12"))
    assert not first["finished"] and first["step"] == 12
    resumed = cli.train_from_argv(["--resume", str(split), "--cache-dir", str(cache_dir)])
    assert resumed["finished"] and resumed["step"] == 24
    a, b = final_weights(straight), final_weights(split)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert resumed["val_nats_per_token"] == straight_val(straight)


def straight_val(out: Path) -> float:
    return json.loads((out / "final.json").read_text())["val_nats_per_token"]


def test_budget_in_tokens_and_flops_sets_the_step_count(tmp_path, cache_dir):
    tokens = cli.train_from_argv(
        tiny_args(tmp_path / "t", cache_dir, "--max-tokens", "2560", "--eval-every", "100")
    )
    assert tokens["total_steps"] == 10  # 2560 tokens / (8 rows x 32 tokens)
    flops = cli.train_from_argv(
        tiny_args(
            tmp_path / "f",
            cache_dir,
            "--max-flops",
            str(tokens["flops_per_token"] * 8 * 32 * 7),
            "--eval-every",
            "100",
        )
    )
    assert flops["total_steps"] == 7


def test_lr_schedule_warmup_then_cosine():
    kwargs = dict(warmup_steps=10, total_steps=110, schedule="cosine", min_lr_ratio=0.1)
    assert schedule.lr_multiplier(0, **kwargs) == pytest.approx(0.1)
    assert schedule.lr_multiplier(9, **kwargs) == pytest.approx(1.0)
    assert schedule.lr_multiplier(60, **kwargs) == pytest.approx(0.55)
    assert schedule.lr_multiplier(110, **kwargs) == pytest.approx(0.1)
    assert schedule.lr_multiplier(50, **{**kwargs, "schedule": "constant"}) == 1.0


def run_cli(*args: str, env_extra: dict | None = None, timeout: int = 300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run(
        list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def launch_two_processes(*train_args: str):
    return run_cli(
        *two_cpu_processes(port=free_port()),
        "train.py",
        *train_args,
        env_extra={"ACCELERATE_USE_CPU": "1"},
    )


@pytest.mark.multiprocess
@pytest.mark.serial
def test_two_processes_reproduce_one_process(tmp_path, cache_dir):
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    common = [
        "--objective",
        "mdm",
        "--max-steps",
        "6",
        "--log-every",
        "1",
        "--eval-every",
        "100",
        "--batch-size",
        "8",
    ]
    one = tmp_path / "one"
    cli.train_from_argv(tiny_args(one, cache_dir, *common))
    two = tmp_path / "two"
    result = launch_two_processes(*tiny_args(two, cache_dir, *common))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 process(es) (DDP)" in result.stdout + result.stderr
    loss_one = [r["loss"] for r in read_metrics(one) if r["kind"] == "train"]
    loss_two = [r["loss"] for r in read_metrics(two) if r["kind"] == "train"]
    assert len(loss_one) == len(loss_two) == 6
    for a, b in zip(loss_one, loss_two):
        assert abs(a - b) / abs(a) < 1e-5
    final_one = json.loads((one / "final.json").read_text())
    final_two = json.loads((two / "final.json").read_text())
    assert final_two["processes"] == 2
    assert abs(final_one["val_nats_per_token"] - final_two["val_nats_per_token"]) < 1e-5 * abs(
        final_one["val_nats_per_token"]
    )

    # Stopped at step 3 and resumed, still over two processes: the uninterrupted run bit for bit.
    split = tmp_path / "split"
    first = launch_two_processes(*tiny_args(split, cache_dir, *common, "--stop-after-steps", "3"))
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = launch_two_processes("--resume", str(split), "--cache-dir", str(cache_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    straight, continued = final_weights(two), final_weights(split)
    for name in straight:
        assert torch.equal(straight[name], continued[name]), name


@pytest.mark.multiprocess
@pytest.mark.serial
def test_two_processes_reproduce_one_process_for_uniform_diffusion(tmp_path, cache_dir):
    # udm draws two uniforms per position (keep, replacement) from the global batch's noise:
    # each process's rows must see the draws one process gives them
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    common = ["--objective", "udm", "--max-steps", "3", "--log-every", "1", "--eval-every", "100"]
    one = tmp_path / "one"
    cli.train_from_argv(tiny_args(one, cache_dir, *common, "--batch-size", "8"))
    two = tmp_path / "two"
    result = launch_two_processes(*tiny_args(two, cache_dir, *common, "--batch-size", "8"))
    assert result.returncode == 0, result.stderr[-3000:]
    loss_one = [r["loss"] for r in read_metrics(one) if r["kind"] == "train"]
    loss_two = [r["loss"] for r in read_metrics(two) if r["kind"] == "train"]
    assert len(loss_one) == len(loss_two) == 3
    for a, b in zip(loss_one, loss_two):
        assert abs(a - b) / abs(a) < 1e-5
    final_one = json.loads((one / "final.json").read_text())
    final_two = json.loads((two / "final.json").read_text())
    assert final_two["processes"] == 2
    assert final_one["val_nats_per_token"] == pytest.approx(final_two["val_nats_per_token"], 1e-5)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--n-kv-heads", "3"], ["n_kv_heads=3", "n_heads=4"]),
        (["--seq-len", "100"], ["seq_len=100", "max_seq_len=64"]),
        (["--objective", "gan"], ["objective='gan'", "'ar'", "'mdm'"]),
        (["--preset", "huge"], ["preset='huge'", "tiny"]),
        (["--dataset", "/no/such/corpus.txt"], ["dataset", "/no/such/corpus.txt"]),
        (["--batch-size", "0"], ["batch_size=0"]),
        (["--protocol", "zip"], ["protocol='zip'"]),
        (["--max-tokens", "100", "--max-flops", "1e9"], ["max_tokens", "max_flops"]),
    ],
)
def test_bad_config_fails_fast_naming_the_field(args, words, tmp_path, cache_dir, capsys):
    code = cli.main(tiny_args(tmp_path, cache_dir, *args))
    message = capsys.readouterr().err
    assert code == 2
    for word in words:
        assert word in message, message
    assert not list_checkpoints(tmp_path / "checkpoints")


def test_cli_reports_errors_without_traceback_and_help_lists_defaults(tmp_path):
    bad = run_cli(
        sys.executable, "train.py", "--preset", "tiny", "--n-heads", "3", "--out", str(tmp_path)
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and "n_heads=3" in bad.stderr
    usage = run_cli(sys.executable, "train.py", "--preset", "tiny", "--help")
    assert usage.returncode == 0
    for flag in (
        "--objective",
        "--n-kv-heads",
        "--max-tokens",
        "--max-flops",
        "--resume",
        "--protocol",
        "--tokenizer",
        "--sliding-window",
        "--schedule",
    ):
        assert flag in usage.stdout
    assert "(default: 32)" in usage.stdout  # tiny's dim, not the dataclass default


def test_resume_refuses_a_different_experiment(tmp_path, cache_dir):
    cli.train_from_argv(tiny_args(tmp_path, cache_dir, "--max-steps", "4", "--eval-every", "100"))
    code = cli.main(
        [
            "--resume",
            str(tmp_path),
            "--cache-dir",
            str(cache_dir),
            "--objective",
            "mdm",
            "--dim",
            "64",
        ]
    )
    assert code == 2
    with pytest.raises(ConfigError) as error:
        cli.train_from_argv(
            [
                "--resume",
                str(tmp_path),
                "--cache-dir",
                str(cache_dir),
                "--objective",
                "mdm",
                "--dim",
                "64",
            ]
        )
    assert "objective: checkpoint 'ar' vs now 'mdm'" in str(error.value)
    assert "dim: checkpoint 32 vs now 64" in str(error.value)


def test_resume_refuses_another_block_size_but_accepts_checkpoints_that_predate_it():
    model_cfg, train_cfg = presets.resolve_config("tiny", {"objective": "bd", "block_size": 4})
    saved = {"model_config": model_cfg.to_dict(), "train_config": dataclasses.asdict(train_cfg)}
    with pytest.raises(ConfigError, match="block_size: checkpoint 4 vs now 8"):
        resume.resumed_config(saved, {"block_size": 8}, allow_change=False)
    assert resume.resumed_config(saved, {"block_size": 8}, allow_change=True)[1].block_size == 8
    model_cfg, train_cfg = presets.resolve_config("tiny", {"objective": "mdm"})
    older = {"model_config": model_cfg.to_dict(), "train_config": dataclasses.asdict(train_cfg)}
    del older["train_config"]["block_size"]  # an MDM run written before the field existed
    assert resume.resumed_config(older, {}, allow_change=False)[1].objective == "mdm"


def test_data_constrained_budget_repeats_a_fixed_set_of_rows(tmp_path, cache_dir):
    summary = cli.train_from_argv(
        tiny_args(
            tmp_path,
            cache_dir,
            "--unique-tokens",
            str(31 * 10),
            "--epochs",
            "4",
            "--eval-every",
            "100",
        )
    )
    assert summary["train_rows"] == 10 and summary["total_steps"] == 5  # ceil(4 x 10 / 8)
    assert summary["epochs_seen"] == pytest.approx(4.0)
    assert summary["peak_memory_bytes"] > 0 and summary["peak_memory_source"]
    code = cli.main(tiny_args(tmp_path / "x", cache_dir, "--epochs", "2", "--max-tokens", "99"))
    assert code == 2


@pytest.mark.parametrize(
    "amx, avx512_bf16, chosen",
    [(True, True, True), (False, True, False), (False, False, False)],
    ids=["AMX (Sapphire Rapids)", "AVX512-BF16 without AMX (Zen 4)", "no bf16 instructions"],
)
def test_precision_auto_takes_bf16_only_where_it_was_measured_faster(
    monkeypatch, amx, avx512_bf16, chosen
):
    from shared import hardware

    monkeypatch.setattr(hardware.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware.torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(
        hardware.torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False
    )
    assert hardware.bf16_is_fast() is chosen
