"""The training run: ``train(spec) -> summary``, from setup through the step loop to the final
validation. Plain or under ``accelerate launch`` (DDP, FSDP2), with the same result.

``batch_size`` is the *global* number of rows per optimizer step, split over processes and
gradient-accumulation micro-steps, so a run gives the same result on 1 or N processes. The rows
of step s and the diffusion noise of step s are pure functions of (seed, s): resuming needs only
the step number plus model/optimizer state, and continues bit-exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import time
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from shared import checkpoint as ckpt
from shared.data.rows import EpochSampler
from shared.errors import ConfigError, ResourceUnavailableError
from shared.faults import StopRequest, fault_active, run_out_of_memory_if, stall_if
from shared.hardware import peak_flops, peak_memory, total_memory
from shared.model import Transformer
from shared.objective import annealing_noise, loss_positions, objective_for_run, slice_noise
from shared.training.checkpoints import CheckpointKeeper
from shared.training.config import TrainingDiverged
from shared.training.guards import (
    check_budget_left,
    check_step_memory,
    forget_unstarted_run,
    is_out_of_memory,
    schedule_history,
    steady_rate,
    warn_if_slow,
)
from shared.training.metrics import Metrics
from shared.training.run import RunSpec
from shared.training.run_folder import RunFolderLock, check_resume_point, claim_run_folder
from shared.training.schedule import batch_generator, curve_steps, total_steps_for
from shared.training.setup import (
    answer_scorer,
    build_optimizer,
    build_scheduler,
    compile_model,
    load_data,
    make_accelerator,
    micro_batch_size,
    parallel_layout,
    training_flops_per_token,
)
from shared.training.warm_start import InitSource, check_start, load_source_weights
from shared.validation import LossTotals, evaluate_rows


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


def precision_name(mixed_precision: str) -> str:
    """What a run computes in, as the --precision flag names it ("no" is accelerate's fp32)."""
    return "fp32" if mixed_precision == "no" else mixed_precision


def claim_folder(spec: RunSpec, accelerator: Accelerator) -> RunFolderLock:
    """Lock the run folder and check it may take this run, on the main process (the only one
    that writes); every process learns the outcome, so all of them stop on a refusal."""
    lock = RunFolderLock(spec.out)
    error, aside = None, None
    if accelerator.is_main_process:
        resume_folder = spec.resume_from.parent.parent if spec.resume_from else None
        resuming = resume_folder is not None and resume_folder.resolve() == spec.out.resolve()
        try:
            lock.acquire()
            aside = claim_run_folder(spec.out, resuming=resuming, overwrite=spec.overwrite)
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
    model_cfg, cfg, out = spec.model, spec.train, spec.out
    saved = ckpt.read_state(spec.resume_from) if spec.resume_from is not None else None
    rank, world = accelerator.process_index, accelerator.num_processes
    log = accelerator.print
    set_seed(cfg.seed)
    # A resumed run keeps its own tokenizer; one initialised from another run takes the source's.
    tokenizer_from = spec.resume_from or (source.checkpoint if source else None)
    data = load_data(cfg, accelerator, tokenizer_from, saved, spec.allow_config_change)
    tokenizer, train_rows = data.tokenizer, data.train_rows
    scored = answer_scorer(cfg, tokenizer, {"training": train_rows, "validation": data.val_rows})
    kept = len(train_rows) * (cfg.seq_len - 1)
    if cfg.unique_tokens and kept != cfg.unique_tokens:
        log(
            f"note: unique_tokens={cfg.unique_tokens} keeps {len(train_rows)} whole row(s) of "
            f"{cfg.seq_len - 1} training tokens: {kept} unique tokens"
        )
    if len(data.val_rows) < 2:
        log(
            f"warning: the validation split has {len(data.val_rows)} row(s): its loss has no "
            "measurable standard error (recorded as null); give validation more text for one"
        )

    run_config = dataclasses.asdict(cfg)
    objective = objective_for_run(cfg.objective, run_config, tokenizer, full_noise_range=False)
    model_cfg = model_cfg.with_vocab(objective.model_vocab_size(tokenizer.vocab_size)).validate()
    # Validation estimates the NELBO over the full noise range even when training clips it.
    eval_objective = objective_for_run(cfg.objective, run_config, tokenizer)
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg)
    n_parameters = model.num_parameters()  # before FSDP, if used, shards the parameters
    tokens_per_step = cfg.batch_size * cfg.seq_len
    flops_token = training_flops_per_token(objective, model_cfg, cfg.seq_len)
    total_steps = total_steps_for(cfg, flops_token * tokens_per_step, len(train_rows))
    check_step_memory(
        micro_batch, cfg.seq_len, model_cfg.vocab_size, *total_memory(accelerator.device)
    )
    if saved is not None:
        check_budget_left(saved["step"], total_steps, spec)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg, total_steps)

    start_step = 0
    if spec.resume_from is not None:
        ckpt.load_weights(spec.resume_from, model)
        start_step = saved["step"]
    elif source is not None:
        log(load_source_weights(source, model, tokenizer.vocab_size))
    # where the weights came from (kept across resumes), so reports can add the source's compute
    init_record = source.record if source else (saved or {}).get("init_from")
    compiled = compile_model(model, cfg.compile, layout, log)
    model, optimizer = accelerator.prepare(model, optimizer)
    if spec.resume_from is not None:
        ckpt.load_training_state(spec.resume_from, model, optimizer.optimizer, scheduler)
        log(f"resumed from {spec.resume_from} at step {start_step}")

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(
            json.dumps(
                {
                    "model_config": model_cfg.to_dict(),
                    "train_config": run_config,
                    "data": data.record,
                    "preset": spec.preset,
                    "init_from": init_record,
                },
                indent=2,
            )
        )
    accelerator.init_trackers("duolm", config={**run_config, **model_cfg.to_dict()})
    metrics = Metrics(out / "metrics.jsonl", accelerator)
    if spec.resume_from is not None and metrics.drop_after(start_step):
        log(f"dropped the metric records after step {start_step}, which this run redoes")
    device = accelerator.device
    dtype = torch.bfloat16 if accelerator.mixed_precision == "bf16" else torch.float32
    peak, peak_source = peak_flops(device, dtype, cfg.peak_tflops)
    log(
        f"{objective.name}: {n_parameters / 1e6:.2f}M parameters, "
        f"{len(train_rows)} train rows x {cfg.seq_len}, {total_steps} steps, "
        f"{world} process(es) ({layout}), "
        f"micro-batch {micro_batch} x {cfg.grad_accum} accumulation, "
        f"precision {precision_name(accelerator.mixed_precision)}, "
        f"peak {peak / 1e12:.3g} TFLOP/s ({peak_source})"
    )

    warn_if_slow(flops_token * tokens_per_step / world, peak, total_steps - start_step, log)
    schedules = schedule_history(saved, start_step, total_steps)
    if len(schedules) > 1 and schedules[-1]["from_step"] == start_step and start_step:
        log(
            f"continuing past step {start_step} under a {total_steps}-step schedule (the run so "
            f"far followed a {schedules[-2]['total_steps']}-step one; final.json records both)"
        )
    token_bytes = tokenizer.token_bytes()
    sampler = EpochSampler(len(train_rows), cfg.seed)
    keeper = CheckpointKeeper(
        out / "checkpoints",
        accelerator,
        tokenizer=tokenizer,
        record={
            "model_config": model_cfg.to_dict(),
            "train_config": run_config,
            "objective": objective.name,
            "data": data.record,
            "total_steps": total_steps,
            "schedule_history": schedules,
            "init_from": init_record,
        },
        keep_last=cfg.keep_checkpoints,
        resumed_from=spec.resume_from,
    )

    def validate(step: int, n_batches: int | None) -> dict[str, float]:
        totals = evaluate_rows(
            model,
            eval_objective,
            data.val_rows,
            token_bytes,
            batch_size=cfg.batch_size,
            micro_batch=micro_batch,
            seed=cfg.eval_seed,
            device=device,
            pad_id=tokenizer.pad_id,
            n_batches=n_batches,
            rank=rank,
            world=world,
            scored=scored,
        )
        fields = [getattr(totals, name) for name in LossTotals.FIELDS]
        summed = accelerator.reduce(torch.tensor(fields, dtype=torch.float64, device=device), "sum")
        merged = LossTotals(
            *(
                type(value)(float(total))
                for value, total in zip(fields, summed.tolist(), strict=True)
            )
        )
        return {"step": step, "kind": "eval", "metric": objective.metric, **merged.as_dict("val")}

    end_step = total_steps
    if cfg.stop_after_steps:
        end_step = min(total_steps, start_step + cfg.stop_after_steps)
    checkpoint_every = cfg.checkpoint_every or cfg.eval_every
    on_curve = set(curve_steps(total_steps, cfg.curve_points))
    model.train()
    progress = tqdm(
        range(start_step, end_step),
        initial=start_step,
        total=total_steps,
        disable=not accelerator.is_local_main_process,
        desc=objective.name,
        dynamic_ncols=True,
    )

    def say(message: str) -> None:  # above the progress bar, once per run rather than per rank
        if accelerator.is_main_process:
            progress.write(message)

    # Throughput counts training steps only: each step's time is added to the window, so the
    # validations and checkpoints between steps never enter tokens/s or MFU.
    window_tokens, window_seconds = 0, 0.0
    throughput: list[float] = []
    stop.on_stop = "saving a checkpoint at the end of this step"
    bad_streak, skipped_steps, stopped_by = 0, 0, None
    for step in progress:
        step_start = time.perf_counter()
        stall_if("stall_in_step", step + 1)
        run_out_of_memory_if("oom_in_step", step + 1)
        rows = torch.as_tensor(
            train_rows[sampler.indices(step * cfg.batch_size, cfg.batch_size)], dtype=torch.long
        )
        generator = batch_generator(cfg.seed, step)
        noise = objective.sample_noise(len(rows), rows.shape[1], generator)
        noise |= annealing_noise(
            cfg.attention_anneal_steps, step, len(rows), generator, model_cfg.sliding_window
        )
        # Normalise by the global token count so the gradient is the same for any split of the
        # batch over processes and micro-steps (DDP averages over processes, hence * world).
        step_scored = loss_positions(rows, tokenizer.pad_id) if scored is None else scored(rows)
        global_tokens = int(step_scored.sum())
        step_nats = torch.zeros((), dtype=torch.float64, device=device)
        for micro in range(cfg.grad_accum):
            start = (rank * cfg.grad_accum + micro) * micro_batch
            batch = rows[start : start + micro_batch].to(device)
            last_micro = micro == cfg.grad_accum - 1
            context = accelerator.no_sync(model) if not last_micro else contextlib.nullcontext()
            with context:
                micro_noise = slice_noise(noise, start, start + micro_batch)
                micro_scored = None
                if scored is not None:
                    micro_scored = step_scored[start : start + micro_batch].to(device)
                out_loss = objective.loss(model, batch, micro_noise, micro_scored)
                if fault_active("nan_loss", step + 1):
                    out_loss.nats = out_loss.nats * float("nan")
                accelerator.backward(out_loss.nats * world / max(global_tokens, 1))
            step_nats += out_loss.nats.detach().double()
        # One reduction per step carries the loss and any stop request, so every process takes
        # the same decision (skip, stop, save) at the same step.
        shared_state = accelerator.reduce(
            torch.stack([step_nats, torch.tensor(float(stop.requested), device=device).double()]),
            "sum",
        )
        loss = float(shared_state[0]) / max(global_tokens, 1)
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        done = step + 1
        if math.isfinite(loss) and math.isfinite(float(grad_norm)):
            optimizer.step()
            bad_streak = 0
        else:
            # Skip the update but keep the schedule and data order moving, so a later resume
            # still lines up step for step.
            bad_streak += 1
            skipped_steps += 1
            metrics.log(
                {
                    "step": done,
                    "kind": "skipped",
                    "loss": loss,
                    "grad_norm": float(grad_norm),
                    "skipped_steps": skipped_steps,
                }
            )
            say(
                f"step {done}: non-finite loss {loss} or gradient norm "
                f"{float(grad_norm)}; update skipped ({bad_streak} in a row)"
            )
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if bad_streak >= cfg.max_bad_steps:
            raise TrainingDiverged(
                f"stopping at step {done}: {bad_streak} consecutive steps with a non-finite loss "
                f"or gradient (last loss {loss}, gradient norm {float(grad_norm)}); the last good "
                f"checkpoint is {keeper.last_good or 'none (no checkpoint was written yet)'}"
            )

        window_seconds += time.perf_counter() - step_start
        window_tokens += tokens_per_step
        if done % cfg.log_every == 0 or done == end_step:
            tokens_per_s = window_tokens / window_seconds
            throughput.append(tokens_per_s)
            mfu = tokens_per_s * flops_token / peak
            metrics.log(
                {
                    "step": done,
                    "kind": "train",
                    "loss": loss,
                    "lr": scheduler.get_last_lr()[0],
                    "tokens_per_s": tokens_per_s,
                    "mfu": mfu,
                    "window_tokens": window_tokens,
                    "window_seconds": window_seconds,
                    "tokens": done * tokens_per_step,
                    "grad_norm": float(grad_norm),
                    "skipped_steps": skipped_steps,
                }
            )
            progress.set_postfix(
                loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", mfu=f"{mfu:.1%}", refresh=False
            )
            window_tokens, window_seconds = 0, 0.0
        evaluated = None
        periodic = done % cfg.eval_every == 0 and done != total_steps
        if periodic or done in on_curve:
            evaluated = validate(done, cfg.eval_batches or None)
            evaluated["flops"] = done * flops_token * tokens_per_step
            evaluated["on_curve"] = done in on_curve
            metrics.log(evaluated)
            say(
                f"step {done}: val {objective.metric} "
                f"{evaluated['val_nats_per_token']:.4f} "
                f"nats/token, {evaluated['val_bpb']:.4f} bits/byte"
            )
        if float(shared_state[1]) > 0:
            stopped_by = stop.signal_name or "a signal to another process"
            end_step = done
        if done % checkpoint_every == 0 or done == end_step:
            keeper.save(
                done,
                evaluated,
                model,
                optimizer.optimizer,
                scheduler,
                healthy=bad_streak == 0,
                announce=say,
            )
        if stopped_by:
            say(f"stopped by {stopped_by} at step {done}; resume with --resume {out}")
            break
    progress.close()
    stop.on_stop = "the steps are done and saved; finishing the final validation"

    finished = end_step == total_steps
    summary: dict[str, Any] = {
        "objective": objective.name,
        "metric": objective.metric,
        "step": end_step,
        "total_steps": total_steps,
        "schedule_history": schedules,
        "finished": finished,
        "stopped_by": stopped_by,
        "skipped_steps": skipped_steps,
        "best_checkpoint": keeper.best,
        "parameters": n_parameters,
        "tokens_seen": end_step * tokens_per_step,
        "flops_per_token": flops_token,
        "train_tokens_per_s": steady_rate(throughput or metrics.train_rates()),
        "peak_flops": peak,
        "peak_flops_source": peak_source,
        "processes": world,
        "parallel_layout": layout,
        "precision": precision_name(accelerator.mixed_precision),
        "compiled": compiled,
        **peak_memory(device),
        "train_rows": len(train_rows),
        "epochs_seen": end_step * cfg.batch_size / len(train_rows),
        "data": data.record,
        "init_from": init_record,
    }
    if finished:
        final = validate(end_step, None)  # the whole validation split
        metrics.log(final)
        summary.update(final)
        log(
            f"final: val {objective.metric} {final['val_nats_per_token']:.4f} nats/token "
            f"(ppl {final['val_ppl']:.2f}), {final['val_bpb']:.4f} bits/byte over "
            f"{final['val_tokens']} tokens"
        )
    if accelerator.is_main_process:
        (out / "final.json").write_text(json.dumps(summary, indent=2))
    # Free the DDP wrapper while the process group is still registered. Otherwise its gradient
    # reducer holds the last reference to the group and destroys it at exit with the GIL held,
    # which deadlocks when gloo's worker thread needs the GIL to free a finished collective's
    # tensors (seen as a hang at exit, about one run in four). end_training then destroys the
    # group through a binding that releases the GIL.
    accelerator.wait_for_everyone()
    model = optimizer = None
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
