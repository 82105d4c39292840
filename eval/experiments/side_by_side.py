"""The same prompts through an AR and an MDM checkpoint, printed in aligned columns.

    python -m eval.experiments.side_by_side runs/demo/ar runs/demo/mdm --prompt "And God said" \\
        --prompt "In the beginning" --gen-length 48 --steps 48 --temperature 0.8
    python -m eval.experiments.side_by_side runs/demo/ar runs/demo/mdm \\
        --infill "And God said" " and it was so."

A prompt is continued by both models. An infilling request (prefix, suffix) shows what each can
do: the MDM fills the middle seeing both sides; the AR model can only continue the prefix.
Each cell reports its NFE (network evaluations) and seconds per sample.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import Ancestral, FixedCount, Threshold
from shared.cli_args import CommandParser, set_threads, utf8_argument
from shared.errors import CheckpointError, result_or_status
from shared.sampling import SamplingConfig


@dataclass
class Cell:
    text: str
    nfe: int
    seconds: float


def ar_continue(
    path: str, prompts: list[str], gen_length: int, temperature: float, seed: int
) -> list[Cell]:
    engine = ARGenerator.from_checkpoint(path)
    cells = []
    for prompt in prompts:  # one at a time: per-sample time and NFE
        config = GenerationConfig(
            max_new_tokens=gen_length, sampling=SamplingConfig(temperature=temperature)
        )
        start = time.perf_counter()
        result = engine.generate([prompt], config, seed=seed)
        cells.append(Cell(result.texts[0], result.forward_passes, time.perf_counter() - start))
    return cells


SAMPLERS = {
    "ancestral": lambda steps: Ancestral(steps),
    "fixed": lambda steps: FixedCount(steps, "low_confidence"),
    "threshold": lambda steps: Threshold(0.9),
}


def mdm_fill(
    path: str,
    prompts: list[str],
    suffixes: list[str | None],
    gen_length: int,
    steps: int,
    sampler: str,
    temperature: float,
    seed: int,
) -> list[Cell]:
    generator = DiffusionGenerator.from_checkpoint(path)
    if generator.objective != "mdm":
        raise ValueError(f"{path} holds a {generator.objective!r} model, not an 'mdm' one")
    config = SamplerConfig(
        SAMPLERS[sampler](steps), sampling=SamplingConfig(temperature=temperature)
    )
    cells = []
    for prompt, suffix in zip(prompts, suffixes):  # one at a time: per-sample time and NFE
        start = time.perf_counter()
        result = generator.generate([prompt], gen_length, config, seed=seed, suffix=suffix)
        cells.append(Cell(result.texts[0], result.nfe, time.perf_counter() - start))
    return cells


def columns(left: str, right: str, width: int) -> str:
    a = textwrap.wrap(left, width) or [""]
    b = textwrap.wrap(right, width) or [""]
    rows = max(len(a), len(b))
    a, b = a + [""] * (rows - len(a)), b + [""] * (rows - len(b))
    return "\n".join(f"{x:<{width}} | {y}" for x, y in zip(a, b))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.prompt and not args.infill:
        args.prompt = [""]
    prompts = args.prompt + [prefix for prefix, _ in args.infill]
    suffixes = [None] * len(args.prompt) + [suffix for _, suffix in args.infill]
    outputs, status = result_or_status(lambda: generate_both(args, prompts, suffixes))
    if status:
        return status
    ar, mdm = outputs
    print_columns(args, prompts, suffixes, ar, mdm)
    return 0


def build_parser() -> CommandParser:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ar_checkpoint")
    parser.add_argument("mdm_checkpoint")
    parser.add_argument("--prompt", action="append", default=[], help="repeatable")
    parser.add_argument(
        "--infill",
        nargs=2,
        action="append",
        default=[],
        metavar=("PREFIX", "SUFFIX"),
        help="repeatable",
    )
    parser.add_argument("--gen-length", type=int, default=48)
    parser.add_argument("--steps", type=int, default=48, help="diffusion steps")
    parser.add_argument(
        "--sampler", choices=["ancestral", "fixed", "threshold"], default="ancestral"
    )
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=int, default=48, help="column width")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    return parser


def generate_both(
    args: argparse.Namespace, prompts: list[str], suffixes: list[str | None]
) -> tuple[list[Cell], list[Cell]]:
    """Every request through both checkpoints, after checking the text and the paths."""
    set_threads(args.threads)
    for prompt in prompts + [suffix for suffix in suffixes if suffix]:
        utf8_argument(prompt, "--prompt/--infill")
    for path in (args.ar_checkpoint, args.mdm_checkpoint):
        if not Path(path).exists():
            raise CheckpointError(f"checkpoint path {path} does not exist")
    with torch.no_grad():  # a context, not a global switch: callers may train afterwards
        ar = ar_continue(args.ar_checkpoint, prompts, args.gen_length, args.temperature, args.seed)
        mdm = mdm_fill(
            args.mdm_checkpoint,
            prompts,
            suffixes,
            args.gen_length,
            args.steps,
            args.sampler,
            args.temperature,
            args.seed,
        )
    return ar, mdm


def print_columns(
    args: argparse.Namespace,
    prompts: list[str],
    suffixes: list[str | None],
    ar: list[Cell],
    mdm: list[Cell],
) -> None:
    """A header, then per request its task line, both texts and both costs in two columns."""
    width = args.width
    header = columns("AR (KV cache)", f"MDM ({args.sampler}, {args.steps} steps)", width)
    print(header + "\n" + "-" * (2 * width + 3))
    for prompt, suffix, a, m in zip(prompts, suffixes, ar, mdm):
        task = (
            f"prompt: {prompt!r}"
            if suffix is None
            else (f"infill: {prompt!r} ... {suffix!r} (AR sees only the prefix)")
        )
        print(task)
        print(columns(a.text, m.text, width))
        print(
            columns(f"[{a.nfe} NFE, {a.seconds:.2f} s]", f"[{m.nfe} NFE, {m.seconds:.2f} s]", width)
        )
        print("-" * (2 * width + 3))


if __name__ == "__main__":
    sys.exit(main())
