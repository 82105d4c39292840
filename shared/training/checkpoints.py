"""Checkpoint keeping during a run: which steps are saved, which one is the best so far, and which
one is the last good one a failed run can point the user to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors import SafetensorError

from shared import checkpoint as ckpt
from shared import sharded_checkpoint as sharded
from shared.door import write_json_atomic
from shared.resume_state import load_training_state
from shared.sharded_index import read_index
from shared.tensor_files import StoredTensor
from shared.tokenizer import Tokenizer


class CheckpointKeeper:
    """Saves a run's checkpoints under ``<out>/checkpoints``: the newest ``keep_last`` plus the
    best by periodic validation loss (``best.json``) and the steps in ``keep_steps``."""

    def __init__(
        self,
        folder: Path,
        accelerator: Accelerator,
        *,
        tokenizer: Tokenizer,
        record: dict[str, Any],
        keep_last: int,
        resumed_from: Path | None,
        keep_steps: frozenset[int] = frozenset(),
        checkpoint_format: str = "single",
    ):
        self.folder, self.accelerator = folder, accelerator
        self.keep_steps = keep_steps  # never pruned (a WSD run's branch points)
        self.tokenizer, self.record, self.keep_last = tokenizer, record, keep_last
        self.format = checkpoint_format  # single | sharded
        self.best = ckpt.read_best(folder)
        # Weights saved in the middle of a streak of skipped steps are not "good".
        self.last_good: Path | None = resumed_from

    def save(
        self,
        step: int,
        val: dict[str, float] | None,
        model,
        optimizer,
        scheduler,
        *,
        healthy: bool,
        announce,
    ) -> None:
        """Checkpoint ``step``; ``val`` is the evaluation of this step's weights, if any."""
        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        path = self.folder / ckpt.checkpoint_name(step)
        is_best = val is not None and (
            self.best is None or val["val_nats_per_token"] < self.best["val_nats_per_token"]
        )
        if is_best:
            self.best = {"step": step, "val_nats_per_token": val["val_nats_per_token"]}
        kept = {self.best["step"]} if self.best else set()
        protect = tuple(self.folder / ckpt.checkpoint_name(s) for s in kept | self.keep_steps)
        try:
            self.write(step, model, optimizer, scheduler, protect)
        except (OSError, SafetensorError) as error:
            error.add_note(self.resume_point(step))
            raise
        if accelerator.is_main_process:
            if is_best:
                write_json_atomic(self.folder / ckpt.BEST_FILE, self.best)
            announce(f"saved {path}" + (" (best so far)" if is_best else ""))
        if healthy:
            self.last_good = path
        accelerator.wait_for_everyone()

    def write(self, step: int, model, optimizer, scheduler, protect: tuple[Path, ...]) -> None:
        """A collective: sharded, every process writes its own shards; single, every process
        takes part in gathering the whole state (under FSDP) and rank 0 writes it."""
        if self.format == "sharded":
            sharded.save_sharded_checkpoint(
                self.folder,
                step,
                model=model,
                optimizer=optimizer,
                tokenizer=self.tokenizer,
                state=self.record,
                scheduler_state=scheduler.state_dict(),
                keep_last=self.keep_last,
                protect=protect,
            )
            return
        weights = ckpt.full_model_state(model)
        optimizer_state = ckpt.full_optimizer_state(model, optimizer)
        if self.accelerator.is_main_process:
            ckpt.save_checkpoint(
                self.folder,
                step,
                weights=weights,
                tokenizer=self.tokenizer,
                state=self.record,
                optimizer_state=optimizer_state,
                scheduler_state=scheduler.state_dict(),
                keep_last=self.keep_last,
                protect=protect,
            )

    def resume_point(self, failed_step: int) -> str:
        """Where the run can go on from after the checkpoint of ``failed_step`` could not be
        written (``save_checkpoint`` left nothing of it): the newest complete checkpoint."""
        kept = ckpt.list_checkpoints(self.folder)
        if not kept:
            return f"no checkpoint of this run was written (step {failed_step} was the first)"
        return (
            f"the checkpoint of step {failed_step} was not kept; the run's newest checkpoint is "
            f"{kept[-1]}: continue from it with --resume {self.folder.parent}"
        )


def format_for(cfg, layout: str, parameters: int) -> str:
    """The checkpoint format a run writes (``sharded_checkpoint.checkpoint_format``)."""
    return sharded.checkpoint_format(cfg.checkpoint_format, layout, parameters)


def check_weights_before_building(path: Path, cfg) -> None:
    """A resumed model is sized by the checkpoint's state.json: a model of that size is built
    only once a meta-device copy of it fits the weights' header (a few-KB checkpoint cannot
    make a resume allocate 13B parameters). A sharded checkpoint's weights are declared by its
    checked index (``shards/index.json``), which stands in for the header."""
    if ckpt.is_sharded_checkpoint(path):
        ckpt.meta_model_fitting(path, cfg, sharded_weights_header(path))
    else:
        ckpt.meta_model_fitting(path, cfg)


# a safetensors header's name for each floating-point dtype a model's weights may have
STORED_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}


def sharded_weights_header(path: Path) -> dict[str, StoredTensor]:
    """{name: StoredTensor} of the weights a sharded checkpoint's checked index declares (its
    ``model/`` tensors), as a single-file checkpoint's safetensors header would."""
    index = read_index(path)
    return {
        key[len("model/") :]: StoredTensor(
            STORED_DTYPES.get(meta.properties.dtype, str(meta.properties.dtype)), tuple(meta.size)
        )
        for key, meta in index.state_dict_metadata.items()
        if key.startswith("model/")
    }


def load_weights_before_wrapping(path: Path, model) -> None:
    """A single-file checkpoint's weights go into the bare model; a sharded one's are read
    after wrapping, each process its own slices (``load_state_after_wrapping``)."""
    if not ckpt.is_sharded_checkpoint(path):
        ckpt.load_weights(path, model)


def load_state_after_wrapping(path: Path, model, optimizer, scheduler) -> None:
    """The training state (and, for a sharded checkpoint, the weights) of either format."""
    if ckpt.is_sharded_checkpoint(path):
        sharded.load_sharded_training_state(path, model, optimizer, scheduler)
    else:
        load_training_state(path, model, optimizer, scheduler)
