"""The training run: ``train(spec) -> summary``, from setup through the step loop to the final
validation. Plain or under ``accelerate launch`` (DDP, FSDP2), with the same result.

``batch_size`` is the *global* number of rows per optimizer step, split over processes and
gradient-accumulation micro-steps, so a run gives the same result on 1 or N processes. The rows
of step s and the diffusion noise of step s are pure functions of (seed, s): resuming needs only
the step number plus model/optimizer state, and continues bit-exactly.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from shared.errors import ConfigError, ResourceUnavailableError
from shared.faults import StopRequest
from shared.training.guards import (
    forget_unstarted_run,
    is_out_of_memory,
)
from shared.training.resume import check_resume_point
from shared.training.run import RunSpec
from shared.training.run_folder import RunFolderLock, claim_run_folder
from shared.training.setup import (
    make_accelerator,
    micro_batch_size,
    parallel_layout,
)
from shared.training.trainer import Trainer
from shared.training.warm_start import InitSource, check_start


def train(spec: RunSpec) -> dict[str, Any]:
    """Run training; returns the final summary (also written to ``<out>/final.json``). The run
    holds its folder's lock from before its first write to its end, on every exit path."""
    if spec.train.num_threads:
        torch.set_num_threads(spec.train.num_threads)
    accelerator = make_accelerator(spec.train, spec.out)
    layout = parallel_layout(accelerator)
    # Refuse a layout the trainer cannot run before touching the run folder.
    micro_batch = micro_batch_size(spec.train, layout, accelerator.num_processes)
    source = check_start(spec.model, spec.train, spec.out, resuming=spec.resume_from is not None)
    lock = claim_folder(spec, accelerator)
    # Signals are taken from here on: one during setup stops the run after its first step.
    stop = StopRequest(on_stop="stopping after the first step, with a checkpoint (setting up)")
    try:
        return run_locked(spec, accelerator, layout, micro_batch, source, stop)
    except (MemoryError, RuntimeError, ValueError) as error:
        out_of_memory = is_out_of_memory(error)
        user_error = out_of_memory or isinstance(error, ValueError)
        if user_error and spec.resume_from is None and accelerator.is_main_process:
            forget_unstarted_run(spec.out)  # so the same command can run again as it is
        if not out_of_memory:
            raise
        raise ResourceUnavailableError(
            f"out of memory: a step of {spec.train.batch_size} rows x {spec.train.seq_len} "
            "tokens does not fit on this machine; lower --batch-size or --seq-len, or raise "
            "--grad-accum (each process then holds batch_size / grad_accum rows at a time)"
        ) from None
    finally:
        stop.close()
        lock.release()


def claim_folder(spec: RunSpec, accelerator: Accelerator) -> RunFolderLock:
    """Lock the run folder and check it may take this run, on the main process (the only one
    that writes); every process learns the outcome, so all of them stop on a refusal."""
    lock = RunFolderLock(spec.out)
    error, aside = None, None
    if accelerator.is_main_process:
        resuming = spec.resume_from is not None and not spec.is_branch
        try:
            lock.acquire()
            sources = [Path(p) for p in (spec.resume_from, spec.train.init_from) if p]
            aside = claim_run_folder(
                spec.out, resuming=resuming, overwrite=spec.overwrite, sources=sources
            )
            if resuming:
                check_resume_point(spec.out, spec.resume_from)
        except ConfigError as refused:
            lock.release()
            error = refused
    failed = accelerator.reduce(torch.tensor(float(error is not None), device=accelerator.device))
    if error is not None:
        raise error
    if float(failed):
        raise ConfigError(f"the main process could not claim the run folder {spec.out}")
    if lock.stale:
        accelerator.print(f"note: took over the stale lock of a run that died ({lock.stale})")
    if aside:
        accelerator.print(f"moved the run that was in {spec.out} aside to {aside}")
    return lock


def run_locked(
    spec: RunSpec,
    accelerator: Accelerator,
    layout: str,
    micro_batch: int,
    source: InitSource | None,
    stop: StopRequest,
) -> dict[str, Any]:
    """Set the run up, train it to its end (or to a stop) and finish it; the caller holds the
    folder's lock."""
    trainer = Trainer(spec, accelerator, layout, micro_batch, source)
    trainer.fit(stop)
    stop.on_stop = "the steps are done and saved; finishing the final validation"
    summary = trainer.finish()
    # Free the DDP wrapper while the process group is still registered. Otherwise its
    # gradient reducer holds the last reference to the group and destroys it at exit with the
    # GIL held, which deadlocks when gloo's worker thread needs the GIL to free a finished
    # collective's tensors (seen as a hang at exit, about one run in four). end_training then
    # destroys the group through a binding that releases the GIL.
    accelerator.wait_for_everyone()
    trainer.model = trainer.optimizer = None
    accelerator.free_memory()
    accelerator.end_training()
    return summary


def release_process_group() -> None:
    """Destroy the process group a run that stopped on an error left behind.

    By now the failed run's frames (and its DDP wrapper) are gone, so the group is destroyed here
    through a binding that releases the GIL, not at interpreter exit with the GIL held (which can
    deadlock against gloo's worker thread; see the end of ``train``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()
