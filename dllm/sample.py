"""Sample from a diffusion checkpoint, masked (mdm), block (bd), uniform-state (udm) or Eso-LM
(eso): the command line.

    python -m dllm.sample runs/demo/mdm --prompt "In the beginning" --gen-length 64 \\
        --sampler fixed --steps 64 --block-length 16 --remasking low_confidence --seed 0
    python -m dllm.sample runs/demo/mdm --prompt "And God said" --suffix " and it was so." \\
        --gen-length 32 --sampler ancestral --steps 32
    python -m dllm.sample runs/demo/mdm --sampler threshold --threshold 0.9 --block-length 16 \\
        --cache approx_dual        # APPROXIMATE: output drifts from the exact sampler
    python -m dllm.sample runs/demo-bd --prompt "In the beginning" --gen-length 64 --sampler fixed
    python -m dllm.sample runs/demo-bd --sampler threshold --threshold 0.9 --no-kv-cache
    python -m dllm.sample runs/demo-udm --prompt "And God said" --steps 32 --greedy-tail
    python -m dllm.sample runs/demo/mdm --sampler eb --gamma 0.01 --block-length 16
    python -m dllm.sample runs/demo/mdm --steps 128 --remdm loop --eta 0.02 --t-on 0.55 \\
        --t-off 0.05 --alpha-on 0.9       # ReMDM: more steps than positions keep correcting
    python -m dllm.sample runs/demo-udm --steps 32 --psi rescale --eta 0.05

The checkpoint says which sampler runs (``dllm.generator.DiffusionGenerator``). A bd checkpoint
decodes its training blocks (``block_size``) left to right with the exact KV cache of the
finished blocks (``--no-kv-cache``: the uncached reference path, same output); ``--cache`` and
``--cfg-scale`` apply to mdm checkpoints only, and a bd checkpoint refuses a ``--block-length``
other than its block size. ``--steps`` is the total over all blocks; by default one step per
position (for bd, per position of the blocks that cover the generation). With ``--eos stop`` a
bd sampler ends after the block in which every sample has produced EOS. A udm checkpoint samples
ancestrally through its posterior (``--steps``, ``--greedy-tail``, ``--corrector``,
``--temperature``, ``--top-p``) and refuses the masked samplers' options; so does an eso
checkpoint, which takes ``--steps`` (its diffusion phase) and ``--alpha-0``. The correctors
(``--remdm`` for mdm and bd, ``--psi`` for udm) and ``--sampler eb``: ``dllm.corrector_flags``.

Prints one completion per sample (the text between prompt and suffix), then one line of
statistics on stderr (``--json`` prints everything as one JSON object instead). User errors exit
with status 2 and one line; ``DUOLM_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from dllm.canvas import EOS_POLICIES
from dllm.corrector_flags import (
    DEFAULT_GAMMA,
    add_corrector_flags,
    check_corrector_options,
    remdm_from_args,
    udm_corrector_config,
)
from dllm.eso.sampler import EsoSamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.sampler import CACHES, SamplerConfig
from dllm.strategies import REMASKING, Ancestral, EntropyBounded, FixedCount, Threshold
from dllm.uniform.sampler import UniformSamplerConfig, distilled_note
from shared.cli_args import (
    MAX_SAMPLES,
    MAX_SAMPLING_STEPS,
    SAMPLES_WHY,
    STEPS_WHY,
    CommandParser,
    DefaultsHelpFormatter,
    at_most,
    device_argument,
    fitting_length,
    positive_argument,
    seed_argument,
    set_threads,
    utf8_argument,
)
from shared.errors import result_or_status
from shared.sampling import SamplingConfig

# Options of one sampler rule only.
SAMPLER_ONLY = {
    "remasking": "fixed",
    "llada_reference": "fixed",
    "threshold": "threshold",
    "schedule": "ancestral",
    "gamma": "eb",
}
# Options of one kind of checkpoint only, with their defaults (what the other kind runs with).
OBJECTIVE_ONLY = {
    "cache": ("mdm", "none"),
    "cfg_scale": ("mdm", 0.0),
    "no_kv_cache": ("bd", False),
    "greedy_tail": ("udm", False),
    "corrector": ("udm", 1.0),
    "psi": ("udm", None),
    "alpha_0": ("eso", None),
}
# Options of the masked samplers that a uniform-state (udm) or Eso-LM (eso) model has no use for.
MASKED_ONLY = ("remasking", "llada_reference", "threshold", "schedule", "block_length")
MASKED_ONLY += ("remdm", "gamma")
UDM_OPTIONS = (
    "--steps, --greedy-tail, --corrector (--kappa), --psi and its knobs, --temperature and --top-p"
)
# The families with a sampler of their own, which the masked samplers' options do not reach.
OWN_SAMPLER = {
    "udm": f"a udm (uniform-state) model: it samples ancestrally through its posterior and "
    f"takes {UDM_OPTIONS}",
    "eso": "an eso (Eso-LM) model: it reveals a share --alpha-0 of the positions in --steps "
    "diffusion steps, then the rest left to right, and takes --steps, --alpha-0, --temperature "
    "and --top-p",
}


def build_parser(prog: str = "python -m dllm.sample") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description="Sample from a diffusion checkpoint: masked (mdm), block (bd), "
        "uniform-state (udm) diffusion or Eso-LM (eso).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_request_arguments(parser)
    add_rule_arguments(parser)
    add_family_arguments(parser)
    add_cache_arguments(parser)
    parser.add_argument("--eos", choices=EOS_POLICIES, default="stop")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return add_corrector_flags(parser)


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """What to sample: the checkpoint, the prompts and the span to fill."""
    parser.add_argument("checkpoint", help="checkpoint directory, or a run / checkpoints folder")
    parser.add_argument("--prompt", action="append", help="prompt text; repeat for a batch")
    parser.add_argument("--suffix", default=None, help="fixed text after the generated span")
    parser.add_argument(
        "--gen-length",
        type=int,
        default=None,
        help="positions to generate (default: 64, or what fits the model's context)",
    )
    parser.add_argument("--num-samples", type=int, default=1, help="samples per prompt")


def add_rule_arguments(parser: argparse.ArgumentParser) -> None:
    """The masked samplers' rule: which sampler, its steps, blocks, remasking and schedule."""
    parser.add_argument(
        "--sampler",
        choices=["ancestral", "fixed", "threshold", "eb"],
        default=None,
        help="mdm and bd: default fixed; udm samples ancestrally through its posterior",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="total steps (default: one per position; bd: per position of the covering blocks; "
        "udm: the posterior steps)",
    )
    parser.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="mdm: semi-AR block length; bd: must be the checkpoint's block size (the default)",
    )
    parser.add_argument(
        "--remasking",
        choices=sorted(REMASKING),
        default=None,
        help="mdm and bd fixed sampler: which positions to reveal (default low_confidence)",
    )
    parser.add_argument(
        "--llada-reference",
        action="store_const",
        const=True,
        default=None,
        help="mdm and bd fixed sampler: LLaDA's generate exactly: each block's remainder tokens "
        "go to its first steps, confidence in float32 (default: the rounded schedule, float64)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="mdm and bd threshold sampler: confidence to reveal at (default 0.9)",
    )
    parser.add_argument(
        "--schedule",
        choices=["linear", "cosine"],
        default=None,
        help="mdm and bd ancestral sampler: noise schedule (default: the checkpoint's)",
    )


def add_family_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of one family (guidance, udm's last step and corrector) and the draw itself."""
    parser.add_argument("--cfg-scale", type=float, default=0.0, help="mdm only")
    parser.add_argument(
        "--greedy-tail",
        action="store_true",
        help="udm only: the last step takes the argmax of the model's prediction",
    )
    parser.add_argument(
        "--corrector",
        type=float,
        default=1.0,
        metavar="KAPPA",
        help="udm only: predictor-corrector (Psi) step, kappa * posterior + (1 - kappa) * the "
        "model's guess noised back to s; 1 = the ancestral sampler",
    )
    parser.add_argument(
        "--alpha-0",
        type=float,
        default=None,
        help="eso only: share of the positions its diffusion phase reveals (default: the "
        "model's; 0 = all left to right, 1 = no autoregressive phase)",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=seed_argument, default=0)


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """What the sampler may reuse between steps (approximate caches, p(x0), bd's KV cache)."""
    parser.add_argument(
        "--cache",
        choices=sorted(CACHES),
        default="none",
        help="mdm only: approx_* caches are APPROXIMATE (Fast-dLLM); none is exact",
    )
    parser.add_argument(
        "--no-reuse",
        action="store_true",
        help="mdm and bd: evaluate the model at every step (disable the exact p(x0) cache)",
    )
    parser.add_argument(
        "--no-kv-cache",
        action="store_true",
        help="bd only: recompute the finished blocks at every step (reference path; same output)",
    )


def check_sampler_options(args: argparse.Namespace) -> None:
    """Refuse options that do not fit the chosen rule (before loading anything)."""
    positive_argument(args.num_samples, "--num-samples")
    at_most(args.num_samples, "--num-samples", MAX_SAMPLES, SAMPLES_WHY)
    prompts = len(args.prompt or [""])
    if prompts * args.num_samples > MAX_SAMPLES:  # each prompt is drawn --num-samples times
        raise ValueError(
            f"--num-samples={args.num_samples} x {prompts} prompts is "
            f"{prompts * args.num_samples:,} samples, more than {MAX_SAMPLES:,} ({SAMPLES_WHY})"
        )
    if args.steps is not None:
        at_most(args.steps, "--steps", MAX_SAMPLING_STEPS, STEPS_WHY)
    if args.gen_length is not None:
        positive_argument(args.gen_length, "--gen-length")
    for prompt in args.prompt or []:
        utf8_argument(prompt, "--prompt")
    if args.suffix is not None:
        utf8_argument(args.suffix, "--suffix")
    # Without --sampler, which rule runs depends on the checkpoint (fixed for mdm and bd, udm's
    # own ancestral sampler), so that check waits for it (check_options_of_the_rule).
    if args.sampler is not None:
        check_options_of_the_rule(args, args.sampler)
    if args.sampler in ("threshold", "eb") and args.steps is not None:
        raise ValueError(f"--steps does not apply to --sampler {args.sampler} (it stops when done)")
    check_corrector_options(args)


def check_options_of_the_rule(args: argparse.Namespace, sampler: str) -> None:
    """Refuse an option of another masked sampler rule than ``sampler``."""
    for option, applies_to in SAMPLER_ONLY.items():
        if getattr(args, option) is not None and sampler != applies_to:
            given = f"--sampler {sampler}" if args.sampler else f"the default --sampler {sampler}"
            raise ValueError(
                f"--{option.replace('_', '-')} only applies to --sampler {applies_to}, not {given}"
            )


def check_objective_options(args: argparse.Namespace, objective: str) -> None:
    """Refuse options of the other kind of checkpoint, and options of another sampler rule than
    the one this checkpoint runs (a udm model has one rule, its own ancestral sampler)."""
    for option, (applies_to, default) in OBJECTIVE_ONLY.items():
        if objective != applies_to and getattr(args, option) != default:
            raise ValueError(
                f"--{option.replace('_', '-')} only applies to {applies_to} checkpoints, and "
                f"{args.checkpoint} was trained with objective {objective!r}"
            )
    if objective not in OWN_SAMPLER:
        check_options_of_the_rule(args, args.sampler or ("ancestral" if args.remdm else "fixed"))
        return
    given = [f"--sampler {args.sampler}"] if args.sampler not in (None, "ancestral") else []
    given += [f"--{o.replace('_', '-')}" for o in MASKED_ONLY if getattr(args, o) is not None]
    given += ["--no-reuse"] if args.no_reuse else []
    if given:
        raise ValueError(
            f"{given[0]} does not apply to {args.checkpoint}, {OWN_SAMPLER[objective]}"
        )


def udm_config_from_args(args: argparse.Namespace, steps: int) -> UniformSamplerConfig:
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)
    config = UniformSamplerConfig(steps, args.greedy_tail, sampling, args.corrector)
    return udm_corrector_config(args, config)


def eso_config_from_args(args: argparse.Namespace, steps: int) -> EsoSamplerConfig:
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)
    return EsoSamplerConfig(steps, args.alpha_0, sampling).validate()


def config_from_args(args: argparse.Namespace, steps: int) -> SamplerConfig:
    """The sampler configuration of the command line, with ``steps`` for the stepped rules."""
    if args.remdm:
        strategy = remdm_from_args(args, steps)
    elif args.sampler == "ancestral":
        strategy = Ancestral(steps, schedule=args.schedule)
    elif args.sampler == "eb":
        strategy = EntropyBounded(DEFAULT_GAMMA if args.gamma is None else args.gamma)
    elif args.sampler in (None, "fixed"):
        reference = {"split": "front", "confidence": "float32"} if args.llada_reference else {}
        strategy = FixedCount(steps, remasking=args.remasking or "low_confidence", **reference)
    else:
        strategy = Threshold(0.9 if args.threshold is None else args.threshold)
    return SamplerConfig(
        strategy,
        block_length=args.block_length,
        sampling=SamplingConfig(temperature=args.temperature, top_p=args.top_p),
        cfg_scale=args.cfg_scale,
        cache=args.cache,
        reuse_predictions=not args.no_reuse,
    ).validate()


def sample_from_args(args: argparse.Namespace) -> tuple:
    """(objective, config, result, steps asked, note) of the command line's request; the note
    is one line for a distilled udm student sampled at a step count it was not distilled for."""
    check_sampler_options(args)
    set_threads(args.threads)
    generator = DiffusionGenerator.from_checkpoint(args.checkpoint, device_argument(args.device))
    check_objective_options(args, generator.objective)
    prompts = (args.prompt or [""]) * args.num_samples
    tokenizer = generator.tokenizer
    longest = max(len(tokenizer.encode(p)) for p in prompts)
    suffix = len(tokenizer.encode(args.suffix)) if args.suffix else 0
    context = generator.model.config.max_seq_len
    gen_length = fitting_length(args.gen_length, context, longest + suffix, "--gen-length")
    canvas = generator.prompt_canvas(prompts, gen_length, suffix=args.suffix)
    steps = generator.steps_per_position(canvas) if args.steps is None else args.steps
    note = None
    if generator.objective == "udm":
        config = udm_config_from_args(args, steps)
        note = distilled_note(generator.state, steps)
    elif generator.objective == "eso":
        config = eso_config_from_args(args, steps)
    else:
        config = config_from_args(args, steps)
    result = generator.fill(
        canvas, config, seed=args.seed, eos=args.eos, kv_cache=not args.no_kv_cache
    )
    return generator.objective, config, result, args.steps, note


def main(argv: list[str] | None = None, prog: str = "python -m dllm.sample") -> int:
    args = build_parser(prog).parse_args(argv)
    sampled, status = result_or_status(lambda: sample_from_args(args))
    if status:
        return status
    objective, config, result, steps_asked, note = sampled
    raw = result.raw
    stats = {
        "objective": objective,
        "sampler": config.strategy.name if isinstance(config, SamplerConfig) else config.name,
        "nfe": raw.nfe,
        "steps": raw.steps,
        "steps_asked": steps_asked,
        "blocks": len(set(raw.block_of_step)),
        "revealed_per_step": raw.revealed.sum(-1).tolist(),
        "cache": raw.cache,
        "approximate": raw.approximate,
    }
    if note:  # a distilled student at a step count it was not distilled for
        stats["note"] = note
    if args.json:
        print(json.dumps({"texts": result.texts, **stats}))
        return 0
    for text in result.texts:
        print(text)
    label = " APPROXIMATE cache" if raw.approximate else ""
    if steps_asked is not None and raw.steps != steps_asked:
        # more steps than positions: the loop ends once nothing is masked
        label += f" (of {steps_asked} steps asked, {raw.steps} ran: nothing was left to reveal)"
    print(
        f"[{objective} {stats['sampler']}] nfe={raw.nfe} steps={raw.steps} "
        f"blocks={stats['blocks']} cache={raw.cache}{label}",
        file=sys.stderr,
    )
    if note:
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
