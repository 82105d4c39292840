"""Sample from a masked-diffusion checkpoint: ``load_and_sample`` and the command line.

    python -m dllm.sample runs/demo/mdm --prompt "In the beginning" --gen-length 64 \\
        --sampler fixed --steps 64 --block-length 16 --remasking low_confidence --seed 0
    python -m dllm.sample runs/demo/mdm --prompt "And God said" --suffix " and it was so." \\
        --gen-length 32 --sampler ancestral --steps 32
    python -m dllm.sample runs/demo/mdm --sampler threshold --threshold 0.9 --block-length 16 \\
        --cache approx_dual        # APPROXIMATE: output drifts from the exact sampler

Prints one completion per sample (the text between prompt and suffix), then one line of
statistics on stderr (``--json`` prints everything as one JSON object instead). User errors exit
with status 2 and one line; ``DUOLM_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from dllm.canvas import EOS_POLICIES, Canvas, apply_eos_policy, infill_canvas, prompt_canvas
from dllm.generate import CACHES, SamplerConfig, SampleResult, sample
from dllm.strategies import REMASKING, Ancestral, FixedCount, Threshold
from shared.checkpoint import load_model_from_checkpoint
from shared.errors import USER_ERRORS
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer


def text_canvas(
    tokenizer: Tokenizer,
    prompts: list[str],
    gen_length: int,
    *,
    suffix: str | None,
    mask_id: int,
    max_seq_len: int,
) -> Canvas:
    """``[BOS] + prompt + [MASK] * gen_length (+ suffix)`` for each prompt text."""
    encoded = tokenizer.encode_batch(prompts)
    if not suffix:
        return prompt_canvas(
            encoded, gen_length, bos_id=tokenizer.eos_id, mask_id=mask_id, max_seq_len=max_seq_len
        )
    lengths = sorted({len(e) for e in encoded})
    if len(lengths) > 1:
        raise ValueError(f"prompts in one batch must have the same length; got lengths {lengths}")
    if isinstance(gen_length, bool) or not isinstance(gen_length, int) or gen_length < 1:
        raise ValueError(f"gen_length={gen_length!r} must be a positive integer")
    tail = tokenizer.encode(suffix)
    suffix_start = 1 + lengths[0] + gen_length
    length = suffix_start + len(tail)
    if length > max_seq_len:
        raise ValueError(
            f"BOS + prompt ({lengths[0]}) + gen_length ({gen_length}) + suffix ({len(tail)}) is "
            f"{length} positions, more than the model's max_seq_len={max_seq_len}"
        )
    fixed = [
        {**{1 + i: t for i, t in enumerate(e)}, **{suffix_start + j: t for j, t in enumerate(tail)}}
        for e in encoded
    ]
    return infill_canvas(
        length, fixed, bos_id=tokenizer.eos_id, mask_id=mask_id, max_seq_len=max_seq_len
    )


def with_model_schedule(config: SamplerConfig, state: dict) -> SamplerConfig:
    """An ancestral rule without a schedule steps under the schedule the model was trained with."""
    rule = config.strategy
    if isinstance(rule, Ancestral) and rule.schedule is None:
        schedule = state.get("train_config", {}).get("schedule", "linear")
        return dataclasses.replace(config, strategy=dataclasses.replace(rule, schedule=schedule))
    return config


def load_for_sampling(
    checkpoint: str | Path,
    objective: str,
    prompts: str | list[str],
    gen_length: int,
    *,
    suffix: str | None,
    device: str,
) -> tuple[Transformer, Tokenizer, dict, Canvas]:
    """(model, tokenizer, state, canvas) for sampling a checkpoint trained with ``objective``
    ("mdm" or "bd"); refuses any other objective."""
    model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint), device)
    if state.get("objective") != objective:
        raise ValueError(
            f"{checkpoint} was trained with objective {state.get('objective')!r}; this sampler "
            f"needs an {objective!r} checkpoint"
        )
    canvas = text_canvas(
        tokenizer,
        [prompts] if isinstance(prompts, str) else list(prompts),
        gen_length,
        suffix=suffix,
        mask_id=model.config.vocab_size - 1,
        max_seq_len=model.config.max_seq_len,
    )
    return model, tokenizer, state, canvas


def decode_generations(
    result: SampleResult, tokenizer: Tokenizer, eos: str
) -> tuple[list[str], SampleResult]:
    """Apply the ``eos`` policy (see ``dllm.canvas.apply_eos_policy``) and decode each row's
    generation region; the returned result holds the processed canvas."""
    tokens, lengths = apply_eos_policy(
        result.tokens, result.region, eos, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id
    )
    result = dataclasses.replace(result, tokens=tokens)
    start = result.region[0]
    texts = [tokenizer.decode(row[start : start + n]) for row, n in zip(tokens, lengths.tolist())]
    return texts, result


def load_and_sample(
    checkpoint: str | Path,
    config: SamplerConfig,
    prompts: str | list[str] = "",
    gen_length: int = 64,
    *,
    suffix: str | None = None,
    seed: int = 0,
    eos: str = "stop",
    device: str = "cpu",
) -> tuple[list[str], SampleResult]:
    """Load an MDM checkpoint and sample one completion per prompt; returns (texts, result).

    ``texts`` are the decoded generation regions after the ``eos`` policy (see
    ``dllm.canvas.apply_eos_policy``); ``result.tokens`` holds the processed canvas.
    """
    model, tokenizer, state, canvas = load_for_sampling(
        checkpoint, "mdm", prompts, gen_length, suffix=suffix, device=device
    )
    config = with_model_schedule(config, state)
    result = sample(model, config, canvas, torch.Generator().manual_seed(seed))
    return decode_generations(result, tokenizer, eos)


# ---- command line ------------------------------------------------------------------------------

SAMPLER_ONLY = {"remasking": "fixed", "threshold": "threshold", "schedule": "ancestral"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dllm.sample",
        description="Sample from a masked-diffusion (mdm) checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("checkpoint", help="checkpoint directory, or a run / checkpoints folder")
    parser.add_argument("--prompt", action="append", help="prompt text; repeat for a batch")
    parser.add_argument("--suffix", default=None, help="fixed text after the generated span")
    parser.add_argument("--gen-length", type=int, default=64, help="positions to generate")
    parser.add_argument("--num-samples", type=int, default=1, help="samples per prompt")
    parser.add_argument("--sampler", choices=["ancestral", "fixed", "threshold"], default="fixed")
    parser.add_argument("--steps", type=int, default=None, help="total steps (default: gen length)")
    parser.add_argument("--block-length", type=int, default=None, help="semi-AR block length")
    parser.add_argument(
        "--remasking",
        choices=sorted(REMASKING),
        default=None,
        help="fixed sampler: which positions to reveal (default low_confidence)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="threshold sampler: confidence to reveal at (default 0.9)",
    )
    parser.add_argument(
        "--schedule",
        choices=["linear", "cosine"],
        default=None,
        help="ancestral sampler: noise schedule (default: the checkpoint's)",
    )
    parser.add_argument("--cfg-scale", type=float, default=0.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache",
        choices=sorted(CACHES),
        default="none",
        help="approx_* caches are APPROXIMATE (Fast-dLLM); none is exact",
    )
    parser.add_argument(
        "--no-reuse",
        action="store_true",
        help="evaluate the model at every step (disable the exact p(x0) cache)",
    )
    parser.add_argument("--eos", choices=EOS_POLICIES, default="stop")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def config_from_args(args: argparse.Namespace) -> SamplerConfig:
    for option, sampler in SAMPLER_ONLY.items():
        if getattr(args, option) is not None and args.sampler != sampler:
            raise ValueError(
                f"--{option} only applies to --sampler {sampler}, not --sampler {args.sampler}"
            )
    steps = args.gen_length if args.steps is None else args.steps
    if args.sampler == "ancestral":
        strategy = Ancestral(steps, schedule=args.schedule)
    elif args.sampler == "fixed":
        strategy = FixedCount(steps, remasking=args.remasking or "low_confidence")
    else:
        if args.steps is not None:
            raise ValueError("--steps does not apply to --sampler threshold (it stops when done)")
        strategy = Threshold(0.9 if args.threshold is None else args.threshold)
    return SamplerConfig(
        strategy,
        block_length=args.block_length,
        sampling=SamplingConfig(temperature=args.temperature, top_p=args.top_p),
        cfg_scale=args.cfg_scale,
        cache=args.cache,
        reuse_predictions=not args.no_reuse,
    ).validate()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.num_samples < 1:
            raise ValueError(f"--num-samples={args.num_samples} must be >= 1")
        config = config_from_args(args)
        prompts = (args.prompt or [""]) * args.num_samples
        texts, result = load_and_sample(
            args.checkpoint,
            config,
            prompts,
            args.gen_length,
            suffix=args.suffix,
            seed=args.seed,
            eos=args.eos,
            device=args.device,
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
        "revealed_per_step": result.revealed.sum(-1).tolist(),
        "cache": result.cache,
        "approximate": result.approximate,
    }
    if args.json:
        print(json.dumps({"texts": texts, **stats}))
        return 0
    for text in texts:
        print(text)
    label = " APPROXIMATE cache" if result.approximate else ""
    print(
        f"[{stats['sampler']}] nfe={result.nfe} steps={result.steps} cache={result.cache}{label}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
