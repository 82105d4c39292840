"""The training command line: every ``ModelConfig`` and ``TrainConfig`` field is a flag, with the
chosen preset's value as its default; the flags typed become a ``RunSpec``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from shared.config import FIELD_TYPES, ModelConfig
from shared.errors import ConfigError, report_user_errors
from shared.training.config import TrainConfig, TrainingDiverged
from shared.training.loop import release_process_group, train
from shared.training.presets import get_preset
from shared.training.run import RunSpec, new_run, resume_run


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def build_parser(preset: dict[str, dict[str, Any]] | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train the shared backbone under an objective (ar, mdm or bd).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset", default="demo", help="named preset (shared/training/presets.py)"
    )
    parser.add_argument(
        "--out", default=None, help="run directory (default: runs/<preset>-<objective>)"
    )
    parser.add_argument(
        "--resume", default=None, help="run or checkpoint directory to continue from"
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even if identity fields (objective, data, tokenizer, shape) "
        "differ from the checkpoint's",
    )
    preset = preset or {"model": {}, "train": {}}
    groups = (("model", ModelConfig, preset["model"]), ("training", TrainConfig, preset["train"]))
    for title, cls, values in groups:
        group = parser.add_argument_group(f"{title} (defaults shown are the preset's)")
        for field in dataclasses.fields(cls):
            if field.name == "vocab_size":
                continue  # set by the tokenizer and objective
            kind = FIELD_TYPES[str(field.type)]
            default = values.get(field.name, field.default)
            group.add_argument(
                _flag(field.name),
                dest=field.name,
                default=argparse.SUPPRESS,
                type=_parse_bool if kind is bool else kind,
                metavar=kind.__name__.upper(),
                help=f"(default: {default})",
            )
    return parser


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Returns the parsed arguments and the explicitly given config overrides."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default="demo")
    known, _ = pre.parse_known_args(argv)
    try:
        preset = get_preset(known.preset)
    except ConfigError:
        preset = None  # reported below by resolve_config, after --help had its chance
    args = build_parser(preset).parse_args(argv)
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in model_fields | train_fields}
    return args, overrides


def spec_from_argv(argv: list[str] | None) -> RunSpec:
    args, overrides = parse_args(argv)
    if args.resume:
        return resume_run(
            args.resume,
            args.out,
            preset=args.preset,
            allow_config_change=args.allow_config_change,
            **overrides,
        )
    return new_run(args.preset, args.out, **overrides)


def train_from_argv(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``train.py`` flags and run; returns the run's summary."""
    return train(spec_from_argv(argv))


def main(argv: list[str] | None = None) -> int:
    """Train; a user error prints one line and returns 2, a diverged run returns 3."""
    try:
        return report_user_errors(lambda: train_from_argv(argv))
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    finally:
        release_process_group()
