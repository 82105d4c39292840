"""Sample from a block diffusion (bd) checkpoint: ``load_and_sample_blocks`` and the command line.

    python -m dllm.block_sample runs/demo-bd --prompt "In the beginning" --gen-length 64 \\
        --sampler fixed --seed 0
    python -m dllm.block_sample runs/demo-bd --sampler threshold --threshold 0.9 --no-kv-cache

Blocks are the checkpoint's training blocks (``block_size``), decoded left to right with the
exact KV cache of finished blocks (``--no-kv-cache``: the uncached reference path, same output).
The options are those of ``python -m dllm.sample``; ``--steps`` is the total over all blocks
(default: one step per block position, i.e. block_size steps per block). ``--cache``,
``--cfg-scale`` and a ``--block-length`` other than the block size are refused. With
``--eos stop`` decoding ends after the block in which every sample has produced EOS.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from dllm.block_generate import grid_blocks, sample_blocks
from dllm.generate import SamplerConfig, SampleResult
from dllm.sample import build_parser as mdm_parser
from dllm.sample import (
    config_from_args,
    decode_generations,
    load_for_sampling,
    with_model_schedule,
)
from shared.errors import USER_ERRORS


def load_and_sample_blocks(
    checkpoint: str | Path,
    config: SamplerConfig,
    prompts: str | list[str] = "",
    gen_length: int = 64,
    *,
    suffix: str | None = None,
    seed: int = 0,
    eos: str = "stop",
    device: str = "cpu",
    kv_cache: bool = True,
    steps_per_position: bool = False,
) -> tuple[list[str], SampleResult]:
    """Load a bd checkpoint and sample one completion per prompt; returns (texts, result).

    ``steps_per_position``: replace the rule's step count by one step per block position.
    """
    model, tokenizer, state, canvas = load_for_sampling(
        checkpoint, "bd", prompts, gen_length, suffix=suffix, device=device
    )
    block_size = int(state["train_config"]["block_size"])
    config = with_model_schedule(config, state)
    if steps_per_position:
        steps = len(grid_blocks(canvas.region, block_size, canvas.length)) * block_size
        config = dataclasses.replace(
            config, strategy=dataclasses.replace(config.strategy, steps=steps)
        )
    result = sample_blocks(
        model,
        config,
        canvas,
        block_size,
        torch.Generator().manual_seed(seed),
        kv_cache=kv_cache,
        eos_id=tokenizer.eos_id if eos == "stop" else None,
    )
    return decode_generations(result, tokenizer, eos)


def build_parser() -> argparse.ArgumentParser:
    parser = mdm_parser()
    parser.prog = "python -m dllm.block_sample"
    parser.description = "Sample from a block diffusion (bd) checkpoint, block by block."
    parser.add_argument(
        "--no-kv-cache",
        action="store_true",
        help="recompute the finished blocks at every step (reference path; same output)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.num_samples < 1:
            raise ValueError(f"--num-samples={args.num_samples} must be >= 1")
        steps_per_position = args.steps is None and args.sampler != "threshold"
        if steps_per_position:
            args.steps = 1  # a placeholder, replaced once the canvas (and its blocks) is known
        config = config_from_args(args)
        texts, result = load_and_sample_blocks(
            args.checkpoint,
            config,
            (args.prompt or [""]) * args.num_samples,
            args.gen_length,
            suffix=args.suffix,
            seed=args.seed,
            eos=args.eos,
            device=args.device,
            kv_cache=not args.no_kv_cache,
            steps_per_position=steps_per_position,
        )
    except USER_ERRORS as error:
        if os.environ.get("DUOLM_DEBUG"):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    stats = {
        "sampler": config.strategy.name,
        "nfe": result.nfe,
        "steps": result.steps,
        "blocks": len(set(result.block_of_step)),
        "cache": result.cache,
    }
    if args.json:
        print(json.dumps({"texts": texts, **stats}))
        return 0
    for text in texts:
        print(text)
    print(
        f"[bd {stats['sampler']}] nfe={result.nfe} steps={result.steps} "
        f"blocks={stats['blocks']} cache={result.cache}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
