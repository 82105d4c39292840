"""What a resume reads from a checkpoint: its training state (optimizer, scheduler, generators)
checked before the run writes anything, then restored into the model's optimizer and the
process's generators. Checkpoints of an earlier release, whose state is pickled, are refused
with the command that converts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from shared.checkpoint import (
    CHECKPOINT_PATTERN,
    MANIFEST,
    load_optimizer_state,
    read_manifest,
    read_state,
)
from shared.errors import CheckpointError
from shared.training_state import (
    OPTIMIZER_RECORD,
    PICKLED_FILES,
    RNG_RECORD,
    read_optimizer_record,
    read_optimizer_state,
    read_rng_state,
    restore_rng_state,
)


def check_training_state(path: Path) -> None:
    """Raise ``CheckpointError`` unless the checkpoint's manifest lists its training state in the
    files this release reads. One of an earlier release, whose state is pickled, is refused
    with the command that converts it: reading a pickle can run code."""
    listed = read_manifest(path)
    pickled = [name for name in PICKLED_FILES if name in listed]
    if pickled:
        raise CheckpointError(
            f"{path}: its training state is in Python pickles ({', '.join(pickled)}, written by "
            "an earlier release), which a resume does not read because unpickling can run "
            f"code; if you trust where it came from, convert it: duolm convert-checkpoint "
            f"{path} --trust"
        )
    if RNG_RECORD not in listed:
        raise CheckpointError(f"{path}: no training state ({RNG_RECORD}) in its {MANIFEST}")
    # The records a resume restores are read and checked now, before the run writes anything:
    # a value out of range would otherwise fail mid-run, after config.json was rewritten.
    state = read_state(path)
    check_step(state, path)
    if "imported_from" in state:
        # an import has weights and a model config but no corpus, optimizer or schedule
        raise CheckpointError(
            f"{path}: an imported model, not a training run, so there is no training to "
            f"continue; train from its weights with --init-from {path}"
        )
    read_rng_state(path)
    if OPTIMIZER_RECORD in listed:
        read_optimizer_record(path)


def check_step(state: dict[str, Any], path: Path) -> None:
    """A checkpoint's state.json names its step: a whole number >= 0, the one in the folder's
    name (``step_000120`` holds step 120)."""
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        shown = repr(step) if len(repr(step)) <= 40 else repr(step)[:37] + "..."
        raise CheckpointError(
            f"{path / 'state.json'}: step is {shown}; it must be a whole number >= 0"
        )
    named = CHECKPOINT_PATTERN.match(path.name)
    if named and int(named.group(1)) != step:
        raise CheckpointError(
            f"{path / 'state.json'}: step is {step}, but the checkpoint's folder is {path.name}"
        )


def load_training_state(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> None:
    """Optimizer, scheduler and RNG state from a checkpoint; ``model`` is the (possibly sharded)
    model the optimizer steps. Every rank calls this."""
    path = Path(path)
    check_training_state(path)
    optimizer_state, scheduler_state = read_optimizer_state(path)
    rng = read_rng_state(path)
    try:
        load_optimizer_state(model, optimizer, optimizer_state)
    except (KeyError, ValueError) as error:
        raise CheckpointError(
            f"{path}: its optimizer state does not fit this model ({error!r})"
        ) from None
    if scheduler is not None and scheduler_state is not None:
        scheduler.load_state_dict(scheduler_state)
    try:
        restore_rng_state(rng)
    except (RuntimeError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{path / RNG_RECORD}: not a usable generator state ({error})"
        ) from None
