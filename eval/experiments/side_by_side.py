"""The same prompts through an AR and a diffusion checkpoint (mdm, bd, udm or eso), printed in
aligned columns.

    python -m eval.experiments.side_by_side runs/demo/ar runs/demo/mdm --prompt "And God said" \\
        --prompt "In the beginning" --gen-length 48 --steps 48 --temperature 0.8
    python -m eval.experiments.side_by_side runs/demo/ar runs/demo/mdm \\
        --infill "And God said" " and it was so."

A prompt is continued by both models. An infilling request (prefix, suffix) shows what each can
do: a masked (mdm) or uniform-state (udm) model fills the middle seeing both sides; the AR model
can only continue the prefix (and a bd block never sees the blocks after it, so bd refuses it).
A udm model samples ancestrally through its posterior (``--sampler ancestral``, optionally
``--greedy-tail``); the fixed, threshold and entropy-bounded (eb) samplers rank [MASK] positions
it does not have. An eso model runs its own sampler (``--steps`` for its diffusion phase, then
left to right), named ``--sampler ancestral`` here.
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
from dllm.corrector_flags import DEFAULT_GAMMA
from dllm.eso.sampler import EsoSamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, EntropyBounded, FixedCount, Threshold
from dllm.uniform.sampler import UniformSamplerConfig
from shared.cli_args import (
    MAX_SAMPLING_STEPS,
    STEPS_WHY,
    CommandParser,
    at_most,
    positive_argument,
    seed_argument,
    set_threads,
    utf8_argument,
)
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
    "eb": lambda steps: EntropyBounded(DEFAULT_GAMMA),
}


def diffusion_config(
    objective: str, sampler: str, steps: int, temperature: float, greedy_tail: bool
) -> SamplerConfig | UniformSamplerConfig | EsoSamplerConfig:
    """The sampler ``--sampler`` names, in the form the checkpoint's family takes."""
    sampling = SamplingConfig(temperature=temperature)
    if objective == "eso" and sampler != "ancestral":
        raise ValueError(
            f"--sampler {sampler} does not apply to an eso (Eso-LM) model: it runs its own "
            "sampler (--steps for its diffusion phase, then left to right): use --sampler ancestral"
        )
    if objective == "eso" and not greedy_tail:
        return EsoSamplerConfig(steps, sampling=sampling)
    if objective == "udm":
        if sampler != "ancestral":
            raise ValueError(
                f"--sampler {sampler} ranks [MASK] positions, which a udm (uniform-state) model "
                "does not have: use --sampler ancestral (optionally --greedy-tail)"
            )
        return UniformSamplerConfig(steps, greedy_tail=greedy_tail, sampling=sampling)
    if greedy_tail:
        raise ValueError(
            f"--greedy-tail is a udm sampler option; the checkpoint's objective is {objective!r}"
        )
    return SamplerConfig(SAMPLERS[sampler](steps), sampling=sampling)


def diffusion_fill(
    path: str,
    prompts: list[str],
    suffixes: list[str | None],
    args: argparse.Namespace,
) -> tuple[list[Cell], str]:
    """Every request through the diffusion checkpoint; its cells and its family."""
    generator = DiffusionGenerator.from_checkpoint(path)
    if generator.objective == "ar":
        raise ValueError(f"{path} holds an 'ar' model, not a diffusion one (mdm, bd, udm or eso)")
    if generator.objective == "bd" and any(suffixes):
        raise ValueError(
            f"{path} is a block diffusion (bd) model: a block never sees the blocks after it, "
            "so it cannot infill; use --prompt, or an mdm or udm checkpoint"
        )
    config = diffusion_config(
        generator.objective, args.sampler, args.steps, args.temperature, args.greedy_tail
    )
    cells = []
    for prompt, suffix in zip(prompts, suffixes):  # one at a time: per-sample time and NFE
        start = time.perf_counter()
        result = generator.generate(
            [prompt], args.gen_length, config, seed=args.seed, suffix=suffix
        )
        cells.append(Cell(result.texts[0], result.nfe, time.perf_counter() - start))
    return cells, generator.objective


MAX_WIDTH = 1000  # characters of one column: each row of the table is padded to it


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
    ar, (diffusion, family) = outputs
    print_columns(args, prompts, suffixes, ar, diffusion, family)
    return 0


def build_parser() -> CommandParser:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ar_checkpoint")
    parser.add_argument("diffusion_checkpoint", help="an mdm, bd or udm run or checkpoint")
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
        "--sampler", choices=["ancestral", "fixed", "threshold", "eb"], default="ancestral"
    )
    parser.add_argument(
        "--greedy-tail", action="store_true", help="udm: the last step takes the argmax"
    )
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=seed_argument, default=0)
    parser.add_argument("--width", type=int, default=48, help="column width")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    return parser


def generate_both(
    args: argparse.Namespace, prompts: list[str], suffixes: list[str | None]
) -> tuple[list[Cell], tuple[list[Cell], str]]:
    """Every request through both checkpoints, after checking the text and the paths; the
    diffusion checkpoint's family comes beside its cells."""
    set_threads(args.threads)
    at_most(args.steps, "--steps", MAX_SAMPLING_STEPS, STEPS_WHY)
    positive_argument(args.width, "--width")
    at_most(args.width, "--width", MAX_WIDTH, "characters per column of a terminal")
    for prompt in prompts + [suffix for suffix in suffixes if suffix]:
        utf8_argument(prompt, "--prompt/--infill")
    for path in (args.ar_checkpoint, args.diffusion_checkpoint):
        if not Path(path).exists():
            raise CheckpointError(f"checkpoint path {path} does not exist")
    with torch.no_grad():  # a context, not a global switch: callers may train afterwards
        ar = ar_continue(args.ar_checkpoint, prompts, args.gen_length, args.temperature, args.seed)
        diffusion = diffusion_fill(args.diffusion_checkpoint, prompts, suffixes, args)
    return ar, diffusion


def print_columns(
    args: argparse.Namespace,
    prompts: list[str],
    suffixes: list[str | None],
    ar: list[Cell],
    diffusion: list[Cell],
    family: str,
) -> None:
    """A header, then per request its task line, both texts and both costs in two columns."""
    width = args.width
    sampler = args.sampler + (" + greedy tail" if args.greedy_tail else "")
    header = columns("AR (KV cache)", f"{family.upper()} ({sampler}, {args.steps} steps)", width)
    print(header + "\n" + "-" * (2 * width + 3))
    for prompt, suffix, a, m in zip(prompts, suffixes, ar, diffusion):
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
