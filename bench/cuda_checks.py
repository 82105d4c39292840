"""The accelerator checks as one short script: bf16, the flash SDPA kernel, multi-step training
(plain and FSDP), KV-cached decoding and training throughput, on the machine it runs on.

    python bench/cuda_checks.py --out runs/cuda-checks            # on a CUDA machine (~5 min)
    python bench/cuda_checks.py --out runs/cpu-checks --quick     # tiny shapes; what CI runs

Each check prints one line, PASS / FAIL / SKIP with its numbers or its reason, and everything
goes to ``<out>/checks.json`` with the machine and the versions. Checks that need CUDA (flash
kernel, bf16 numerics, FSDP with NCCL) SKIP on a machine without it, saying so; the others run
on any device. Exit status 1 when a check fails.

1. ``bf16``        demo-shaped model: log-probabilities under bf16 autocast against fp32
                   (max and mean absolute difference), loss and gradients finite.
2. ``flash``       causal and bidirectional forwards with only the flash SDPA kernel allowed;
                   equal to the math kernel within bf16 tolerance.
3. ``train``       ``train.py`` for a few hundred steps at ``--precision auto``: the loss falls,
                   validation is finite, the chosen precision is recorded.
4. ``fsdp``        ``train.py`` under ``configs/accelerate/fsdp_1node.yaml`` with one process:
                   it runs as FSDP2 and its checkpoint loads into an unsharded model.
5. ``decode``      KV-cached greedy decoding equals recomputing the whole prefix every step.
6. ``throughput``  ``bench/train_throughput.py``: AR and MDM training tokens/s, alternating.
7. ``peers``       ``bench/train_peers.py``: our AR and MDM steps against Hugging Face Llama (and
                   litgpt when installed), tokens/s and MFU against the device's measured peak.
8. ``flex``        flex attention (compiled, a sparse block mask) against SDPA with the dense
                   boolean mask, for the block-diffusion step and an AR step under a sliding
                   window: equal losses, step times.
9. ``compile``     the AR training step with ``--compile on`` against eager: equal loss, times.

Not timed by ``eval.speed.throughput.measure``: it times generation, and the times here are a
check's wall time and training steps (forward + backward).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torch.nn.attention import SDPBackend, sdpa_kernel

from arlm.generate import ARGenerator, GenerationConfig
from dllm.block.objective import BlockDiffusionObjective
from shared import door
from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.hardware import cpu_name
from shared.model import Transformer
from shared.objective import build_objective
from shared.sampling import SamplingConfig
from shared.training.presets import get_preset
from shared.training.setup import compile_model, compiler_problem


class Skip(Exception):
    """A check that cannot run here; the message says why."""


def demo_model(device: str, quick: bool, seed: int = 0) -> Transformer:
    shape = get_preset("tiny" if quick else "demo-d256")["model"]
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**shape, "vocab_size": 512})).to(device).eval()


def check_bf16(device: str, quick: bool, out: Path) -> dict:
    if device != "cuda":
        raise Skip("bf16 numerics are checked on CUDA (on CPUs bf16 is often emulated)")
    model = demo_model(device, quick)
    tokens = torch.randint(0, 512, (4, model.config.max_seq_len), device=device)
    with torch.no_grad():
        reference = model(tokens, "causal").float().log_softmax(-1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = model(tokens, "causal").float().log_softmax(-1)
    difference = (low - reference).abs()
    model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tokens, "causal").float().log_softmax(-1).mean()
    loss.backward()
    finite_grads = all(torch.isfinite(p.grad).all() for p in model.parameters())
    result = {
        "max_abs_logprob_diff": float(difference.max()),
        "mean_abs_logprob_diff": float(difference.mean()),
        "loss_finite": bool(torch.isfinite(loss)),
        "grads_finite": bool(finite_grads),
    }
    # bf16 keeps 8 bits of mantissa: log-probabilities of a random model agree to ~1e-2
    result["passed"] = (
        result["loss_finite"] and finite_grads and result["max_abs_logprob_diff"] < 0.1
    )
    return result


def check_flash(device: str, quick: bool, out: Path) -> dict:
    if device != "cuda":
        raise Skip("the flash SDPA kernel exists only on CUDA")

    model = demo_model(device, quick).to(torch.bfloat16)
    tokens = torch.randint(0, 512, (2, model.config.max_seq_len), device=device)
    result: dict = {}
    with torch.no_grad():
        for attention in ("causal", "bidirectional"):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                flash = model(tokens, attention).float()  # raises if flash cannot serve it
            with sdpa_kernel(SDPBackend.MATH):
                math = model(tokens, attention).float()
            result[f"{attention}_max_abs_diff"] = float((flash - math).abs().max())
    result["passed"] = all(v < 0.1 for v in result.values())
    return result


def run_command(command: list[str], log: Path, env: dict | None = None) -> str:
    started = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )
    door.write_atomic(log, done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:4])}... exited {done.returncode} after "
            f"{time.perf_counter() - started:.0f} s; see {log}"
        )
    return done.stdout + done.stderr


def train_losses(run: Path) -> list[float]:
    lines = door.read_text(run / "metrics.jsonl").splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]


def check_train(device: str, quick: bool, out: Path) -> dict:
    run = out / "train"
    steps = "40" if quick else "300"
    preset = "tiny" if quick else "smoke"
    command = [sys.executable, "train.py", "--preset", preset, "--objective", "mdm"]
    command += ["--out", str(run), "--max-steps", steps, "--eval-every", steps]
    run_command([*command, "--precision", "auto", "--log-every", "10"], out / "train.log")
    final = door.read_json_file(run / "final.json")
    losses = train_losses(run)
    result = {
        "preset": preset,
        "steps": final["step"],
        "precision": final["precision"],
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "val_nats_per_token": final["val_nats_per_token"],
        "train_tokens_per_s": final["train_tokens_per_s"],
    }
    result["passed"] = losses[-1] < losses[0] and bool(
        torch.isfinite(torch.tensor(final["val_nats_per_token"]))
    )
    return result


def check_fsdp(device: str, quick: bool, out: Path) -> dict:
    if device != "cuda":
        raise Skip(
            "accelerate enables FSDP on accelerator devices only (tests/test_fsdp.py "
            "covers FSDP2 on CPU processes)"
        )

    run = out / "fsdp"
    config = ROOT / "configs" / "accelerate" / "fsdp_1node.yaml"
    command = ["accelerate", "launch", "--config_file", str(config), "--num_processes", "1"]
    command += ["train.py", "--preset", "tiny", "--out", str(run), "--max-steps", "20"]
    run_command(command, out / "fsdp.log")
    final = door.read_json_file(run / "final.json")
    model, _, _ = load_model_from_checkpoint(run)
    result = {
        "parallel_layout": final["parallel_layout"],
        "precision": final["precision"],
        "val_nats_per_token": final["val_nats_per_token"],
        "checkpoint_parameters": model.num_parameters(),
    }
    result["passed"] = final["parallel_layout"] == "FSDP2" and final["finished"]
    return result


def check_decode(device: str, quick: bool, out: Path) -> dict:
    model = demo_model(device, quick)
    prompts = [[1, 2, 3, 4], [5, 6]]
    new = 16 if quick else 64
    config = GenerationConfig(
        max_new_tokens=new, sampling=SamplingConfig(temperature=0.0), stop_on_eos=False
    )
    cached = ARGenerator(model, eos_id=0, pad_id=0).generate(prompts, config, seed=0).tokens
    recomputed = []
    with torch.no_grad():
        for prompt in prompts:
            row = torch.tensor([prompt], device=device)
            for _ in range(new):
                following = model(row, "causal")[:, -1].argmax(-1, keepdim=True)
                row = torch.cat([row, following], dim=1)
            recomputed.append(row[0, len(prompt) :].tolist())
    return {"tokens_per_row": new, "rows": len(prompts), "passed": cached == recomputed}


def check_throughput(device: str, quick: bool, out: Path) -> dict:
    preset = "tiny" if quick else "demo"
    rounds = "2" if quick else "8"
    text = run_command(
        [sys.executable, "bench/train_throughput.py", "--preset", preset, "--rounds", rounds],
        out / "throughput.log",
    )
    speeds = dict(re.findall(r"^\| (ar|mdm) \| [\d.]+ \| ([\d,]+) \|", text, re.MULTILINE))
    if set(speeds) != {"ar", "mdm"}:
        raise RuntimeError(f"could not read tokens/s from bench/train_throughput.py: {text[-500:]}")
    ar, mdm = (float(speeds[k].replace(",", "")) for k in ("ar", "mdm"))
    return {
        "preset": preset,
        "ar_tokens_per_s": ar,
        "mdm_tokens_per_s": mdm,
        "mdm_over_ar": mdm / ar,
        "passed": ar > 0 and mdm > 0,
    }


def check_peers(device: str, quick: bool, out: Path) -> dict:
    if quick:
        settings = ["--preset", "tiny", "--rounds", "1", "--warmup", "0", "--precision", "fp32"]
    else:
        settings = ["--preset", "demo-d256", "--rounds", "8", "--warmup", "2", "--precision"]
        settings += ["both", "--only", "ar,mdm,bd,hf,litgpt"]
    command = [sys.executable, "bench/train_peers.py", "--json", str(out / "peers.json")]
    run_command(command + settings, out / "peers.log")
    result = door.read_json_file(out / "peers.json")
    return {"results": result.get("ratios", result), "passed": True}


def timed_steps(step: Callable[[], torch.Tensor], device: str, rounds: int) -> list[float]:
    """Seconds per call of ``step`` (forward + backward), after one warm-up call."""
    times = []
    for index in range(rounds + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        step().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if index:
            times.append(time.perf_counter() - started)
    return times


def check_flex(device: str, quick: bool, out: Path) -> dict:
    """Flex attention against SDPA with the boolean mask: the block-diffusion step (two
    streams) and an AR step under a sliding window; equal losses, then step times."""
    if device != "cuda" and not quick:
        raise Skip("flex attention pays only on CUDA (on a CPU the SDPA path is used)")
    length = 128 if not quick else 16
    batch = 32 if not quick else 2
    model = demo_model(device, quick).train()
    objective = BlockDiffusionObjective(pad_id=0, block_size=16 if not quick else 4, mask_id=511)
    tokens = torch.randint(1, 511, (batch, length), device=device)
    noise = objective.sample_noise(batch, length, torch.Generator().manual_seed(0))

    def use_flex(flex: bool) -> None:
        objective.flex = flex

    results = {
        "block_diffusion": flex_against_sdpa(device, objective, model, tokens, noise, use_flex)
    }
    # a sliding window of 16 over rows of 512 (the demo-d256 shape, max_seq_len raised)
    window_length = 512 if not quick else 16
    shape = {**get_preset("tiny" if quick else "demo-d256")["model"], "vocab_size": 512}
    shape.update(max_seq_len=window_length, sliding_window=16 if not quick else 4)
    torch.manual_seed(0)
    windowed = Transformer(ModelConfig(**shape)).to(device).train()
    ar = build_objective("ar", pad_id=0)
    rows = torch.randint(1, 511, (batch // 4 or 1, window_length), device=device)

    def window_flex(flex: bool) -> None:
        windowed.flex_attention = flex

    results["sliding_window"] = flex_against_sdpa(device, ar, windowed, rows, {}, window_flex)
    return {**results, "passed": all(r["agree"] for r in results.values())}


def flex_against_sdpa(device, objective, model, tokens, noise, use_flex) -> dict:
    losses, times = {}, {}
    for name, flex in (("sdpa", False), ("flex", True)):
        use_flex(flex)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            with torch.no_grad():
                losses[name] = float(objective.loss(model, tokens, noise).nats)
            if device == "cuda":  # flex attention has no backward on a CPU (torch 2.13)
                step = lambda: objective.loss(model, tokens, noise).nats  # noqa: E731
                times[name] = timed_steps(step, device, 10)
    median = {name: statistics.median(t) for name, t in times.items()}
    return {
        "losses": losses,
        "median_step_s": median or "forward only on a CPU",
        "flex_speedup": median["sdpa"] / median["flex"] if median else None,
        "agree": abs(losses["flex"] - losses["sdpa"]) <= 2e-2 * abs(losses["sdpa"]),
    }


def check_compile(device: str, quick: bool, out: Path) -> dict:
    problem = compiler_problem()
    if problem is not None:
        raise Skip(f"torch.compile does not work here: {problem}")
    eager = demo_model(device, quick).train()
    compiled = demo_model(device, quick).train()
    compile_model(compiled, "on", "single process", print)
    objective = build_objective("ar", pad_id=0)
    tokens = torch.randint(
        1, 511, (32 if not quick else 2, 128 if not quick else 16), device=device
    )
    noise = objective.sample_noise(len(tokens), tokens.shape[1], torch.Generator().manual_seed(0))
    losses, median = {}, {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        losses[name] = float(objective.loss(model, tokens, noise).nats)
        step = lambda m=model: objective.loss(m, tokens, noise).nats  # noqa: E731
        median[name] = statistics.median(timed_steps(step, device, 2 if quick else 10))
    return {
        "losses": losses,
        "median_step_s": median,
        "compile_speedup": median["eager"] / median["compiled"],
        "passed": abs(losses["eager"] - losses["compiled"]) <= 1e-3 * abs(losses["eager"]),
    }


CHECKS: dict[str, Callable[[str, bool, Path], dict]] = {
    "bf16": check_bf16,
    "flash": check_flash,
    "train": check_train,
    "fsdp": check_fsdp,
    "decode": check_decode,
    "throughput": check_throughput,
    "peers": check_peers,
    "flex": check_flex,
    "compile": check_compile,
}


def machine() -> dict:
    info = {
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/cuda-checks")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and step counts")
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        print(f"error: unknown checks {unknown}; valid: {list(CHECKS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    door.make_folders(out)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {"machine": machine(), "device": device, "quick": args.quick, "checks": {}}
    print(f"device {device}; {report['machine']}")
    for name in names:
        started = time.perf_counter()
        try:
            result = CHECKS[name](device, args.quick, out)
            status = "PASS" if result.pop("passed") else "FAIL"
        except Skip as why:
            result, status = {"reason": str(why)}, "SKIP"
        except Exception as error:  # a check that crashes is a failed check, not a crash
            result, status = {"error": f"{type(error).__name__}: {error}"}, "FAIL"
        result |= {"status": status, "seconds": round(time.perf_counter() - started, 1)}
        report["checks"][name] = result
        details = ", ".join(f"{k}={v}" for k, v in result.items() if k != "status")
        print(f"{status:4s} {name}: {details}", flush=True)
    door.write_atomic(out / "checks.json", json.dumps(report, indent=2))
    return 1 if any(c["status"] == "FAIL" for c in report["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
