"""Checks around a training run that keep its records true and its folder usable: a resume with
nothing left to do refuses, a run that failed before its first checkpoint leaves nothing that
blocks its rerun, a step that cannot be fast is announced, an out-of-memory error is named."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared import checkpoint as ckpt
from shared import door
from shared.door import read_json_file, remove_file
from shared.errors import ConfigError
from shared.hardware import peak_flops
from shared.training.config import TrainConfig
from shared.training.provenance import RECORD
from shared.training.run import RunSpec
from shared.training.run_folder import MARKER


def is_out_of_memory(error: BaseException) -> bool:
    """numpy's and Python's MemoryError, torch's CPU allocator and CUDA out-of-memory errors."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        phrase in text for phrase in ("can't allocate memory", "out of memory")
    )


def forget_unstarted_run(out: Path) -> None:
    """Remove what a new run wrote before failing, when it never saved a checkpoint: its
    config.json and metrics would otherwise make the folder refuse the same command."""
    if ckpt.list_checkpoints(out / "checkpoints"):
        return
    for name in ("config.json", RECORD, "metrics.jsonl", "final.json", MARKER):
        remove_file(out / name)
    with contextlib.suppress(OSError):
        door.remove_empty_folder(out / "checkpoints")


def check_step_memory(
    rows: int, seq_len: int, vocab_size: int, memory_bytes: int, where: str
) -> None:
    """Refuse a step that cannot fit before anything is written: the float32 logits of the
    ``rows`` a process holds at once and their gradient alone take 8 x rows x seq_len x vocab
    bytes, a lower bound on the step's memory."""
    needed = 8 * rows * seq_len * vocab_size
    if needed > memory_bytes:
        raise ConfigError(
            f"a step of {rows} rows x {seq_len} tokens needs at least {needed / 2**30:,.0f} GiB "
            f"(its logits and their gradient alone) and {where} has {memory_bytes / 2**30:,.0f} "
            "GiB: lower --batch-size or --seq-len, or raise --grad-accum (each process holds "
            "batch_size / grad_accum rows at a time); out of memory otherwise"
        )


def warn_if_slow(flops_per_step: float, peak: float, steps: int, log) -> None:
    """Say before the first step when one step cannot take less than a minute here: the FLOPs a
    process does per step over its peak FLOP/s is a lower bound on the step's time."""
    seconds = flops_per_step / peak
    if seconds > 60:
        log(
            f"warning: one training step needs at least {seconds / 60:.0f} min on this machine "
            f"({flops_per_step:.3g} FLOPs at a peak of {peak / 1e12:.3g} TFLOP/s), so "
            f"{steps} steps need at least {seconds * steps / 3600:.1f} h; Ctrl-C or SIGTERM "
            "twice stops it at once"
        )


class MfuMeter:
    """A run's model FLOPs utilisation: achieved FLOP/s over the peak (``peak_flops``: the
    ``--peak-tflops`` given, the GPU table, or the best measurement kept for this device). An MFU
    above 100% means the peak is wrong, not that the run is fast: the first one is said, once,
    naming the peak used."""

    def __init__(self, peak: float, source: str, say: Callable[[str], None]):
        self.peak, self.source, self.say = peak, source, say
        self.warned = False

    @classmethod
    def for_run(
        cls, device: torch.device, dtype: torch.dtype, cfg: TrainConfig, say: Callable[[str], None]
    ) -> MfuMeter:
        return cls(*peak_flops(device, dtype, cfg.peak_tflops, Path(cfg.cache_dir)), say)

    def __call__(self, flops_per_s: float) -> float:
        mfu = flops_per_s / self.peak
        if mfu > 1 and not self.warned:
            self.warned = True
            self.say(
                f"warning: MFU {mfu:.0%} is above 100%: the peak it divides by, "
                f"{self.peak / 1e12:.3g} TFLOP/s ({self.source}), is below what this run "
                "reaches; give the hardware's peak with --peak-tflops"
            )
        return mfu


def steady_rate(rates: list[float]) -> float | None:
    """The median tokens/s of the logging windows after the first (which includes start-up
    work); None when nothing was measured."""
    return float(np.median(rates[1:] or rates)) if rates else None


def check_budget_left(step: int, total_steps: int, spec: RunSpec) -> None:
    """Refuse a resume with nothing to do: a checkpoint past the budget, or a run that already
    finished at it (its final.json says so). A run killed between its last checkpoint and its
    final validation may resume at the budget: it then only validates."""
    where = f"the checkpoint {spec.resume_from} is at step {step}"
    keep = "nothing to train, and the run's records stay as they are"
    if step > total_steps:
        raise ConfigError(
            f"{where}, past this run's budget of {total_steps} steps: {keep} (raise the budget, "
            "e.g. --max-steps, to continue it)"
        )
    final = spec.out / "final.json"
    if step == total_steps and final.is_file():
        summary = read_json_file(final, allow_nan=True)
        if isinstance(summary, dict) and summary.get("finished") and summary.get("step") == step:
            raise ConfigError(
                f"{where}, and the run in {spec.out} already finished its budget of "
                f"{total_steps} steps there: {keep} (raise the budget, e.g. --max-steps, to "
                "continue it)"
            )


def schedule_history(
    saved: dict[str, Any] | None, start_step: int, total_steps: int, agrees: bool = False
) -> list[dict[str, int]]:
    """The learning-rate schedules a run followed, as ``{"from_step", "total_steps"}`` segments:
    one for a run trained under one budget; a run continued to a larger budget (whose schedule
    was stretched at the step it was continued from) has one more per change. ``agrees``: the
    new budget's schedule takes the same rates as the old one at every step before
    ``start_step`` (a WSD branch before its cooldown), so the run is the one scheduled for the new
    budget from the start and keeps one segment."""
    if saved is None:
        return [{"from_step": 0, "total_steps": total_steps}]
    history = saved.get("schedule_history") or [
        {"from_step": 0, "total_steps": saved.get("total_steps", total_steps)}
    ]
    if history[-1]["total_steps"] != total_steps:
        if agrees and len(history) == 1:
            return [{"from_step": 0, "total_steps": total_steps}]
        history = [*history, {"from_step": start_step, "total_steps": total_steps}]
    return history


def data_notes(cfg: TrainConfig, train_rows: int, val_rows: int) -> list[str]:
    """What a run says about its data before training: how many unique tokens a
    ``unique_tokens`` budget really keeps (whole rows), and a validation split too small for a
    standard error."""
    notes = []
    kept = train_rows * (cfg.seq_len - 1)
    if cfg.unique_tokens and kept != cfg.unique_tokens:
        notes.append(
            f"note: unique_tokens={cfg.unique_tokens} keeps {train_rows} whole row(s) of "
            f"{cfg.seq_len - 1} training tokens: {kept} unique tokens"
        )
    if val_rows < 2:
        notes.append(
            f"warning: the validation split has {val_rows} row(s): its loss has no measurable "
            "standard error (recorded as null); give validation more text for one"
        )
    return notes


def schedule_notes(
    schedules: list[dict[str, int]], start_step: int, total_steps: int, branch_of: str | None
) -> list[str]:
    """What a continued run says about its schedule: a branch (off the checkpoint
    ``branch_of``) and whether its rates so far were those of its own budget; a run continued
    under another budget's schedule."""
    notes = []
    if branch_of:
        same = f": the rates so far are those of a {total_steps}-step run"
        notes.append(
            f"branched from {branch_of} at step {start_step}"
            + (same if len(schedules) == 1 else "")
        )
    if len(schedules) > 1 and schedules[-1]["from_step"] == start_step and start_step:
        notes.append(
            f"continuing past step {start_step} under a {total_steps}-step schedule (the run so "
            f"far followed a {schedules[-2]['total_steps']}-step one; final.json records both)"
        )
    return notes
