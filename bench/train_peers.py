"""Our training step against other implementations of the same model, measured in one process.

    python bench/train_peers.py [--preset demo-d256] [--precision fp32|bf16|both] [--rounds 12]
                                [--warmup 2] [--threads 2] [--only ar,mdm,bd,hf,litgpt]
                                [--json runs/train-peers.json]

Configurations, all on the same batch of real rows of the preset's corpus (its first
``batch_size`` packed rows) with the same scored positions:

- ``ar``, ``mdm``: our backbone under each objective, stepped as ``shared/training/loop.py``
  does (loss normalised by the batch's loss tokens, backward, gradient clipping, AdamW and the
  learning-rate schedule with the preset's settings, ``shared.training.setup``);
- ``bd`` (opt-in, ``--only ...,bd``): block diffusion with the preset's block size (16 when it
  sets none); each data row runs as a noisy and a clean stream, so its tokens/s is about half
  and its FLOPs per token twice the AR's: compare MFU, or the ``bd/ar`` ratio with that in mind;
- ``hf``: ``transformers.LlamaForCausalLM`` at our config (``arlm.export``'s mapping), SDPA
  attention, its own causal-LM loss through ``labels=``;
- ``litgpt``: litgpt's ``GPT`` at the closest config, its ``chunked_cross_entropy`` loss;
  optional (``bench/peer_models.py`` says how to install it); skipped with the reason when
  it cannot be imported.

The peers start from a copy of our AR model's weights and take the same optimizer step. Before
timing, fp32 losses on the batch must agree with our AR loss within 1e-4 (the configs are the
same model). Timed steps go round-robin: each round one forward + backward + AdamW step of every
(configuration, precision), in an order rotated by one each round. Reported per configuration
and precision: min and median tokens/s (data tokens, batch_size x seq_len, per step), MFU of
the median against a matmul peak measured in this run, and ratios of tokens/s paired by round
(median, min, max). FLOPs per token are ``shared.model.flops_per_token`` for every
configuration (the same math).

Not timed by ``eval.speed.throughput.measure``: it times generation (a call that returns
generated tokens), and a timed call here is an optimizer step as the training loop takes it
(backward, clipping, AdamW, schedule), checked for equal losses first and counted in data
tokens and MFU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_models import (
    hf_llama,
    hf_loss,
    litgpt_gpt,
    litgpt_loss,
    litgpt_modules,
    masked_labels,
    parameter_count,
)
from train_throughput import preset_batch

from shared import door
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.door import write_atomic
from shared.hardware import cpu_name, peak_flops
from shared.model import Transformer, flops_per_token
from shared.objective import loss_positions, objective_for_run
from shared.training.config import TrainConfig
from shared.training.schedule import batch_generator
from shared.training.setup import build_optimizer, build_scheduler, training_flops_per_token

NAMES = ("ar", "mdm", "bd", "hf", "litgpt")
DEFAULT = ("ar", "mdm", "hf", "litgpt")  # block diffusion is opt-in: its step costs two rows
OURS, PEERS = ("ar", "mdm"), ("hf", "litgpt")
BD_BLOCK_SIZE = 16  # when the preset sets none
LABELS = {
    "ar": "ours, AR objective",
    "mdm": "ours, MDM objective",
    "bd": "ours, block diffusion (noisy + clean stream)",
    "hf": "transformers LlamaForCausalLM (sdpa)",
    "litgpt": "litgpt GPT",
}
LOSS_TOLERANCE = 1e-4  # fp32, same weights, same batch


@dataclasses.dataclass
class Runner:
    """One configuration: its model, optimizer and schedule, and its loss (mean over the loss
    tokens) of a batch at a given step."""

    model: nn.Module
    loss: Callable[[torch.Tensor, int], torch.Tensor]
    flops_per_token: float
    parameters: int
    loss_tokens: int
    optimizer: torch.optim.Optimizer = dataclasses.field(init=False)
    scheduler: Any = dataclasses.field(init=False)


def our_runner(name: str, train_cfg: TrainConfig, shape: dict, tokenizer, batch) -> Runner:
    objective = objective_for_run(
        name, dataclasses.asdict(train_cfg), tokenizer, full_noise_range=False
    )
    model_cfg = ModelConfig(**shape).with_vocab(objective.model_vocab_size(tokenizer.vocab_size))
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg).to(batch.device).train()

    def loss(tokens: torch.Tensor, index: int) -> torch.Tensor:
        generator = batch_generator(train_cfg.seed, index)
        noise = objective.sample_noise(len(tokens), tokens.shape[1], generator)
        tokens_scored = int(loss_positions(tokens, tokenizer.pad_id).sum())
        return objective.loss(model, tokens, noise).nats / max(tokens_scored, 1)

    return Runner(
        model,
        loss,
        training_flops_per_token(objective, model_cfg, train_cfg.seq_len),
        model.num_parameters(),
        int(loss_positions(batch, tokenizer.pad_id).sum()),
    )


def peer_runner(name: str, ar_model: Transformer, pad_id: int, batch, seq_len: int) -> Runner:
    model = (hf_llama if name == "hf" else litgpt_gpt)(ar_model).to(batch.device)
    loss_of = (hf_loss if name == "hf" else litgpt_loss)(pad_id)
    labels = masked_labels(batch, pad_id)[:, 1:]  # both shift by one: position i scores i+1
    return Runner(
        model,
        lambda tokens, index: loss_of(model, tokens),
        flops_per_token(ar_model.config, seq_len),
        parameter_count(model),
        int((labels != -100).sum()),
    )


def fp32_loss(runner: Runner, batch: torch.Tensor) -> float:
    with torch.no_grad():
        return float(runner.loss(batch, 0))


def build_runners(
    preset: dict, tokenizer, batch: torch.Tensor, only: list[str]
) -> tuple[dict[str, Runner], dict[str, str], dict[str, Any]]:
    """(runners to time, skipped configurations with the reason, the correctness guard)."""
    train_cfg = TrainConfig(**preset["train"]).validate()
    ar = our_runner("ar", train_cfg, preset["model"], tokenizer, batch)
    runners: dict[str, Runner] = {"ar": ar}
    if "mdm" in only:
        runners["mdm"] = our_runner("mdm", train_cfg, preset["model"], tokenizer, batch)
    if "bd" in only:
        bd_cfg = dataclasses.replace(train_cfg, block_size=train_cfg.block_size or BD_BLOCK_SIZE)
        runners["bd"] = our_runner("bd", bd_cfg, preset["model"], tokenizer, batch)
    skipped: dict[str, str] = {}
    ar_loss = fp32_loss(ar, batch)
    guard: dict[str, Any] = {"ar_loss_fp32": ar_loss, "tolerance": LOSS_TOLERANCE}
    for name in (p for p in PEERS if p in only):
        if name == "litgpt":
            module, why = litgpt_modules()
            if module is None:
                skipped[name] = why
                continue
        try:
            runner = peer_runner(name, ar.model, tokenizer.pad_id, batch, train_cfg.seq_len)
        except (ImportError, ValueError) as error:  # no transformers; a shape it cannot hold
            skipped[name] = f"{type(error).__name__}: {error}"
            continue
        peer_loss = fp32_loss(runner, batch)
        agree = abs(peer_loss - ar_loss) <= LOSS_TOLERANCE
        guard[name] = {
            "loss_fp32": peer_loss,
            "abs_difference": abs(peer_loss - ar_loss),
            "parameters": runner.parameters,
            "ours_parameters": ar.parameters,
            "passed": agree and runner.parameters == ar.parameters,
        }
        if not guard[name]["passed"]:
            skipped[name] = (
                f"not the same model: loss {peer_loss:.6f} vs ours {ar_loss:.6f}, "
                f"{runner.parameters:,} vs {ar.parameters:,} parameters"
            )
            continue
        runners[name] = runner
    if "ar" not in only:
        del runners["ar"]
    for runner in runners.values():
        runner.optimizer = build_optimizer(runner.model, train_cfg)
        runner.scheduler = build_scheduler(runner.optimizer, train_cfg, train_cfg.max_steps)
    return runners, skipped, guard


def train_step(runner: Runner, batch: torch.Tensor, bf16: bool, index: int, clip: float) -> float:
    """Seconds of one optimizer step as the training loop takes it."""
    device = batch.device.type
    start = time.perf_counter()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        loss = runner.loss(batch, index)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(runner.model.parameters(), clip or float("inf"))
    if math.isfinite(float(loss.detach())) and math.isfinite(float(grad_norm)):
        runner.optimizer.step()
    runner.scheduler.step()
    runner.optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def paired_ratios(numerator: list[float], denominator: list[float]) -> dict[str, Any]:
    """numerator[r] / denominator[r] for each round r, and their median, min and max."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return {
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "per_round": ratios,
    }


def summarise(seconds: list[float], tokens: int, flops: float, peak: float) -> dict[str, Any]:
    speeds = [tokens / s for s in seconds]
    median = statistics.median(speeds)
    return {
        "tokens_per_s_median": median,
        "tokens_per_s_min": min(speeds),
        "tokens_per_s_per_round": speeds,
        "mfu_median": median * flops / peak,
        "step_seconds": seconds,
    }


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="demo-d256")
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT),
        help=f"comma-separated subset of {','.join(NAMES)} (bd is opt-in)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(args.only) - set(NAMES))
    if unknown or not args.only:
        parser.error(f"--only {unknown or 'nothing'}: choose from {','.join(NAMES)}")
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset, tokenizer, batch = preset_batch(args.preset, device)
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    runners, skipped, guard = build_runners(preset, tokenizer, batch, args.only)
    torch.set_num_threads(args.threads)  # again, in case a peer's import changed it
    if "hf" in guard and not guard["hf"]["passed"]:
        print(f"FAIL: Hugging Face Llama is not our model at this config: {guard['hf']}")
        return 1
    peaks = {}
    for precision in precisions:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        peaks[precision] = peak_flops(torch.device(device), dtype, 0.0)
    clip = TrainConfig(**preset["train"]).grad_clip
    seconds = time_rounds(runners, batch, precisions, clip, args)
    results = {
        "machine": machine_record(device, skipped),
        "settings": settings_record(args, batch, precisions),
        "peak": {p: {"flops": f, "source": s} for p, (f, s) in peaks.items()},
        "guard": guard,
        "configurations": configurations_record(args.only, runners, skipped, seconds, batch, peaks),
        "ratios": {},
    }
    for precision in precisions:
        speeds = {
            name: results["configurations"][name]["results"][precision]["tokens_per_s_per_round"]
            for name in runners
        }
        pairs = [(o, p) for o in OURS for p in PEERS if o in speeds and p in speeds]
        pairs += [(ours, "ar") for ours in ("mdm", "bd") if ours in speeds and "ar" in speeds]
        results["ratios"][precision] = {
            f"{a}/{b}": paired_ratios(speeds[a], speeds[b]) for a, b in pairs
        }
    print_report(results)
    if args.json:
        door.make_folders(args.json.parent)
        write_atomic(args.json, json.dumps(results, indent=2))
        print(f"\nwrote {args.json}")
    return 0


def time_rounds(runners, batch, precisions, clip, args) -> dict[tuple[str, str], list[float]]:
    """Each (configuration, precision)'s step seconds over the timed rounds: every round runs
    every pair once, round-robin, the order rotated by one each round; warm-up rounds untimed."""
    keys = [(name, precision) for precision in precisions for name in runners]
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
    for index in range(args.warmup + args.rounds):
        shift = index % len(keys)
        for name, precision in keys[shift:] + keys[:shift]:
            elapsed = train_step(runners[name], batch, precision == "bf16", index, clip)
            if index >= args.warmup:
                seconds[name, precision].append(elapsed)
    return seconds


def machine_record(device: str, skipped: dict[str, str]) -> dict[str, Any]:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "litgpt": package_version("litgpt") if "litgpt" not in skipped else "absent",
    }


def settings_record(args, batch: torch.Tensor, precisions: list[str]) -> dict[str, Any]:
    return {
        "preset": args.preset,
        "batch_rows": len(batch),
        "seq_len": batch.shape[1],
        "tokens_per_step": batch.numel(),
        "rounds": args.rounds,
        "warmup": args.warmup,
        "precisions": precisions,
        "order": "round-robin over (configuration, precision), rotated by one each round",
        "flops_per_token": "shared.model.flops_per_token for every configuration",
    }


def configurations_record(only, runners, skipped, seconds, batch, peaks) -> dict[str, Any]:
    """Each configuration asked for: skipped with the reason, or its size and speeds."""
    configurations = {}
    for name in only:
        entry: dict[str, Any] = {"label": LABELS[name]}
        if name in skipped:
            entry |= {"status": "skipped", "reason": skipped[name]}
        else:
            runner = runners[name]
            entry |= {
                "status": "measured",
                "parameters": runner.parameters,
                "flops_per_token": runner.flops_per_token,
                "loss_tokens": runner.loss_tokens,
                "results": {
                    p: summarise(seconds[name, p], batch.numel(), runner.flops_per_token, pk[0])
                    for p, pk in peaks.items()
                },
            }
        configurations[name] = entry
    return configurations


def print_report(results: dict[str, Any]) -> None:
    machine, settings = results["machine"], results["settings"]
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['threads']} threads, "
        f"device {machine['device']}; python {machine['python']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}, litgpt {machine['litgpt']}"
    )
    print(
        f"preset {settings['preset']}: batch {settings['batch_rows']} x {settings['seq_len']} "
        f"tokens; {settings['rounds']} timed rounds after {settings['warmup']} warm-up, "
        f"{settings['order']}"
    )
    for precision, peak in results["peak"].items():
        print(f"peak {precision}: {peak['flops'] / 1e12:.3f} TFLOP/s ({peak['source']})")
    print(
        "MFU = median tokens/s x FLOPs per token / peak, FLOPs per token by "
        "shared.model.flops_per_token for every configuration (the same math)"
    )
    guard = results["guard"]
    for name in PEERS:
        if name in guard:
            check = guard[name]
            print(
                f"guard {name}: fp32 loss {check['loss_fp32']:.6f} vs ours "
                f"{guard['ar_loss_fp32']:.6f} (|diff| {check['abs_difference']:.1e}, "
                f"tolerance {guard['tolerance']:.0e}); "
                f"parameters {check['parameters']:,} vs ours {check['ours_parameters']:,}: "
                f"{'PASS' if check['passed'] else 'FAIL'}"
            )
    print(
        "\n| configuration | precision | parameters | loss tokens | median tokens/s "
        "| min tokens/s | MFU (median) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, entry in results["configurations"].items():
        if entry["status"] == "skipped":
            print(f"| {name} | - | - | - | skipped: {entry['reason']} | | |")
            continue
        for precision, r in entry["results"].items():
            print(
                f"| {name} | {precision} | {entry['parameters']:,} | {entry['loss_tokens']:,} | "
                f"{r['tokens_per_s_median']:,.0f} | {r['tokens_per_s_min']:,.0f} | "
                f"{r['mfu_median']:.2%} |"
            )
    print("\n| tokens/s ratio, paired by round | precision | median | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for precision, ratios in results["ratios"].items():
        for pair, r in ratios.items():
            print(f"| {pair} | {precision} | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
