"""Where a training step's time goes: the torch profiler over a few optimizer steps of one
configuration of ``bench/train_peers.py`` (ours or a peer), grouped into categories.

    python bench/profile_step.py [--preset demo-d256] [--config ar] [--precision bf16]
                                 [--steps 5] [--threads 2] [--top 25]

Prints the top operators by self CPU time and the share of each category (matmuls, attention,
normalisation, RoPE, the loss, the optimizer, elementwise and copies, the rest) of the profiled
steps' total self time, with the machine and versions. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_peers import build_runners, train_step
from train_throughput import preset_batch

from shared.cli_args import CommandParser
from shared.hardware import cpu_name

# (category, substrings of aten/profiler op names), first match wins
CATEGORIES = (
    ("optimizer (AdamW, grad clip)", ("adam", "_foreach", "clip_grad", "norm_", "lerp", "addcdiv")),
    ("attention (SDPA)", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("loss (cross-entropy)", ("cross_entropy", "nll_loss", "log_softmax", "_log_softmax")),
    ("matmuls (linear layers)", ("mm", "matmul", "linear", "addmm", "bmm")),
    ("normalisation (RMSNorm)", ("rsqrt", "pow", "mean", "rms_norm")),
    ("masking and indexing", ("index", "masked", "where", "nonzero", "gather", "scatter")),
    ("elementwise and copies", ("mul", "add", "silu", "copy", "to", "cat", "neg", "sub", "div")),
)


def category(name: str) -> str:
    lowered = name.lower()
    for label, keys in CATEGORIES:
        if any(key in lowered for key in keys):
            return label
    return "other"


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="demo-d256")
    parser.add_argument("--config", choices=["ar", "mdm", "hf"], default="ar")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    preset, tokenizer, batch = preset_batch(args.preset)
    only = sorted({"ar", args.config})
    runners, skipped, _ = build_runners(preset, tokenizer, batch, only)
    if args.config not in runners:
        print(f"error: {args.config} cannot run here: {skipped.get(args.config)}", file=sys.stderr)
        return 2
    runner = runners[args.config]
    clip = preset["train"].get("grad_clip", 1.0)
    bf16 = args.precision == "bf16"
    for index in range(2):  # warm-up: allocator, autocast caches, first-call work
        train_step(runner, batch, bf16, index, clip)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        seconds = [train_step(runner, batch, bf16, 2 + i, clip) for i in range(args.steps)]
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    shares: dict[str, float] = defaultdict(float)
    for event in events:
        shares[category(event.key)] += event.self_cpu_time_total / total
    tokens = batch.numel() * args.steps / sum(seconds)
    print(
        f"{args.config} on {args.preset}, {args.precision}, {args.steps} profiled steps, "
        f"{tokens:,.0f} tokens/s under the profiler; {cpu_name()}, {args.threads} threads, "
        f"torch {torch.__version__}"
    )
    print("\n| category | share of self CPU time |\n| --- | --- |")
    for label, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {share:.1%} |")
    print(
        "\n| operator | self CPU ms per step | share | calls per step |\n| --- | --- | --- | --- |"
    )
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(
            f"| {event.key} | {event.self_cpu_time_total / 1000 / args.steps:.2f} | "
            f"{event.self_cpu_time_total / total:.1%} | {event.count // args.steps} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
