"""Resume policy: a checkpoint's config with only the flags typed now applied on top, refusing
changes to the fields that define the experiment; and a resume into the run's own folder only
from its newest valid checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.checkpoint import list_checkpoints, verify_checkpoint
from shared.config import ModelConfig
from shared.errors import CheckpointError, ConfigError
from shared.training.config import IDENTITY_FIELDS, TrainConfig
from shared.training.presets import split_overrides


def config_differences(
    saved: dict[str, Any],
    current: dict[str, Any],
    fields: tuple[str, ...],
    describe: Callable[[str, Any, Any], str] = lambda name, saved, now: (
        f"{name}: checkpoint {saved!r} vs now {now!r}"
    ),
) -> list[str]:
    """Lines (``describe(name, saved, now)``) naming each of ``fields`` that differs; a field the
    checkpoint predates (absent from its config) is not compared."""
    return [
        describe(name, saved[name], current.get(name))
        for name in fields
        if name in saved and saved[name] != current.get(name)
    ]


# Fields whose default changed after checkpoints were saved without them: the value such a
# checkpoint's run trained with. (udm's curriculum is now on by default; a run saved before the
# field existed trained without it, and resuming it must not switch it on.)
PREDATED_DEFAULTS = {"curriculum_steps": 0}
# Settings a resume takes from the command line or the default, never from the checkpoint.
MACHINE_CHOICES = ("cache_dir",)


def resumed_config(
    saved: dict[str, Any], overrides: dict[str, Any], allow_change: bool
) -> tuple[ModelConfig, TrainConfig]:
    """The checkpoint's config with only the flags typed now applied on top. Changing a field that
    defines the experiment (objective, data, tokenizer, model shape) refuses unless allowed. A
    field the checkpoint predates takes the value its run trained with (``PREDATED_DEFAULTS``),
    else today's default."""
    model_over, train_over = split_overrides(overrides)
    model_cfg = ModelConfig(**{**saved["model_config"], **model_over}).validate()
    # Where caches go is this machine's choice (--cache-dir, else the default), never the
    # folder a run recorded: the run may come from someone else.
    kept = {k: v for k, v in saved["train_config"].items() if k not in MACHINE_CHOICES}
    train_cfg = TrainConfig(**{**PREDATED_DEFAULTS, **kept, **train_over})
    train_cfg = train_cfg.validate()
    shape_fields = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size")
    changed = config_differences(
        {**saved["model_config"], **saved["train_config"]},
        {**model_cfg.to_dict(), **dataclasses.asdict(train_cfg)},
        IDENTITY_FIELDS + shape_fields,
    )
    if changed and not allow_change:
        raise ConfigError(
            "refusing to resume: these fields differ from the checkpoint's "
            "(pass --allow-config-change to accept):\n  " + "\n  ".join(changed)
        )
    return model_cfg, train_cfg


def check_resume_point(folder: Path, checkpoint: Path) -> None:
    """Resuming into the run's own folder from ``checkpoint`` continues the run; a valid later
    checkpoint there means the run went on past it, and resuming would write over that branch:
    refuse and name the safe ways (a new folder, or the newest checkpoint)."""
    step = int(checkpoint.name.rsplit("_", 1)[-1])
    later = []
    for candidate in list_checkpoints(Path(folder) / "checkpoints"):
        if int(candidate.name.rsplit("_", 1)[-1]) > step:
            try:
                verify_checkpoint(candidate)
                later.append(candidate.name)
            except CheckpointError:
                pass  # an incomplete later checkpoint is what resuming from here recovers from
    if later:
        raise ConfigError(
            f"{checkpoint} is not the newest checkpoint of the run in {folder} (it also has "
            f"{', '.join(later)}); resuming there would overwrite them. Branch from it into a "
            f"new folder with --out NEW_FOLDER, or continue the run from its newest checkpoint "
            f"with --resume {folder}"
        )
