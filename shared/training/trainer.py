"""One training run as named units: ``Trainer`` sets the run up (data, model, records), takes
one optimizer step (``train_step``), validates, runs the step loop (``fit``) and finishes it
(``finish``: the final validation and the summary), under ``shared.training.loop``'s lock."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from shared import checkpoint as ckpt
from shared.door import write_json_atomic
from shared.faults import StopRequest
from shared.hardware import peak_memory, total_memory
from shared.model import Transformer
from shared.objective import objective_for_run
from shared.training import checkpoints as keeping
from shared.training.config import TrainingDiverged
from shared.training.data_order import DataOrder
from shared.training.evaluation import Evaluation
from shared.training.guards import (
    MfuMeter,
    check_budget_left,
    check_step_memory,
    data_notes,
    schedule_history,
    schedule_notes,
    steady_rate,
    warn_if_slow,
)
from shared.training.metrics import Metrics
from shared.training.provenance import begin_run, end_run
from shared.training.run import RunSpec
from shared.training.run_folder import mark_folder
from shared.training.schedule import (
    branch_points,
    check_cooldown,
    curve_steps,
    fit_to_run,
    schedules_agree,
    total_steps_for,
)
from shared.training.setup import (
    answer_scorer,
    build_optimizer,
    build_scheduler,
    compile_model,
    follow_schedule,
    load_data,
    precision_name,
    training_flops_per_token,
)
from shared.training.step import StepResult, TrainingStep
from shared.training.warm_start import InitSource, load_source_weights


class Trainer(TrainingStep, Evaluation):
    """One training run in units: setup (``__init__``), ``train_step`` (its component
    ``shared.training.step``), ``validate`` (``shared.training.evaluation``), ``fit`` (the step
    loop and the checkpoint cadence) and ``finish``. The setup's order is part of the result:
    the seed is set before the data and again before the weights."""

    def __init__(
        self,
        spec: RunSpec,
        accelerator: Accelerator,
        layout: str,
        micro_batch: int,
        source: InitSource | None,
    ):
        self.spec, self.cfg, self.out = spec, spec.train, spec.out
        self.accelerator, self.layout, self.micro_batch = accelerator, layout, micro_batch
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        self.device = accelerator.device
        self.log = accelerator.print
        self.saved = ckpt.read_state(spec.resume_from) if spec.resume_from is not None else None
        set_seed(self.cfg.seed)
        self.load_data(source)
        self.build_model(source)
        # Everything a resume reads is checked before the first write (config.json, the
        # marker, the metrics): a refused resume leaves the run as it was.
        self.order = DataOrder.for_run(self.data, self.cfg, accelerator)
        self.order.check_resume((self.saved or {}).get("data_position"), self.start_step)
        self.schedules = self.schedule_record()
        self.metrics = Metrics(self.out / "metrics.jsonl", accelerator)
        redone = self.metrics.lines_to_drop(self.start_step) if self.saved is not None else 0
        self.keeper = self.checkpoint_keeper()  # reads and checks best.json
        self.write_records(redone)
        self.token_bytes = self.tokenizer.token_bytes()
        self.curve_points_at = set(curve_steps(self.total_steps, self.cfg.curve_points))
        # the step loop's counters (``fit``)
        self.end_step = self.total_steps
        self.bad_streak, self.skipped_steps, self.stopped_by = 0, 0, None
        self.throughput: list[float] = []
        self.progress: tqdm | None = None

    # ------------------------------------------------------------------------------------ setup
    def load_data(self, source: InitSource | None) -> None:
        """The tokenizer, the training and validation rows, and the answer positions."""
        cfg, spec = self.cfg, self.spec
        # A resumed run keeps its own tokenizer; one initialised from another takes the source's.
        tokenizer_from = spec.resume_from or (source.checkpoint if source else None)
        self.data = load_data(
            cfg, self.accelerator, tokenizer_from, self.saved, spec.allow_config_change
        )
        self.tokenizer, self.train_rows = self.data.tokenizer, self.data.train_rows
        splits = {"training": self.train_rows, "validation": self.data.val_rows}
        self.scored = answer_scorer(cfg, self.tokenizer, splits)
        for line in data_notes(cfg, len(self.train_rows), len(self.data.val_rows)):
            self.log(line)

    def build_model(self, source: InitSource | None) -> None:
        """The objectives, the model and its optimizer and schedule, loaded from the checkpoint
        or the source run when there is one, and wrapped for the process layout."""
        cfg, spec = self.cfg, self.spec
        self.run_config = dataclasses.asdict(cfg)
        self.objective = objective_for_run(
            cfg.objective, self.run_config, self.tokenizer, full_noise_range=False
        )
        vocab = self.objective.model_vocab_size(self.tokenizer.vocab_size)
        self.model_cfg = spec.model.with_vocab(vocab).validate()
        # Validation estimates the NELBO over the full noise range even when training clips it.
        self.eval_objective = objective_for_run(cfg.objective, self.run_config, self.tokenizer)
        if spec.resume_from is not None:  # refused before a model of the saved size is made
            keeping.check_weights_before_building(spec.resume_from, self.model_cfg)
        torch.manual_seed(cfg.seed)
        model = Transformer(self.model_cfg)
        self.n_parameters = model.num_parameters()  # before FSDP, if used, shards them
        self.tokens_per_step = cfg.batch_size * cfg.seq_len
        self.flops_token = training_flops_per_token(self.objective, self.model_cfg, cfg.seq_len)
        step_flops = self.flops_token * self.tokens_per_step
        self.total_steps = total_steps_for(cfg, step_flops, self.data.n_train_rows)
        check_cooldown(cfg, self.total_steps)
        fit_to_run(self.objective, self.total_steps, self.log)
        self.branch_points = frozenset(branch_points(cfg, self.total_steps))
        memory = total_memory(self.device)
        check_step_memory(self.micro_batch, cfg.seq_len, self.model_cfg.vocab_size, *memory)
        if self.saved is not None:
            check_budget_left(self.saved["step"], self.total_steps, spec)
        optimizer = build_optimizer(model, cfg)
        self.scheduler = build_scheduler(optimizer, cfg, self.total_steps)
        self.start_step = 0
        if spec.resume_from is not None:
            keeping.load_weights_before_wrapping(spec.resume_from, model)
            self.start_step = self.saved["step"]
        elif source is not None:
            self.log(load_source_weights(source, model, self.tokenizer.vocab_size))
        # where the weights came from (kept across resumes), so reports can add its compute
        self.init_record = source.record if source else (self.saved or {}).get("init_from")
        self.init_checkpoint = source.checkpoint if source else None
        # a run continued in another folder (a WSD cooldown branch) names the checkpoint it left
        self.branched_from = (self.saved or {}).get("branched_from")
        if spec.is_branch:
            self.branched_from = str(spec.resume_from)
        self.compiled = compile_model(model, cfg.compile, self.layout, self.log)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        if spec.resume_from is not None:
            keeping.load_state_after_wrapping(
                spec.resume_from, self.model, self.optimizer.optimizer, self.scheduler
            )
            follow_schedule(self.scheduler)
            self.log(f"resumed from {spec.resume_from} at step {self.start_step}")

    def schedule_record(self) -> list[dict[str, int]]:
        """The schedules this run and the ones it continues followed (``schedule_history``)."""
        return schedule_history(
            self.saved,
            self.start_step,
            self.total_steps,
            self.saved is not None
            and schedules_agree(
                self.cfg, self.saved["total_steps"], self.total_steps, self.start_step
            ),
        )

    def write_records(self, redone: int) -> None:
        """config.json, the trackers and the metrics file (less its ``redone`` lines of steps
        this run does again); the run's one-line description, and how its schedule relates to
        the one it continues, if any."""
        cfg, accelerator = self.cfg, self.accelerator
        if accelerator.is_main_process:
            mark_folder(self.out, "run")  # made here, by this run's first write
            write_json_atomic(self.out / "config.json", self.run_record(), durable=False)
            # the code it trains under, checked again in ``finish``
            begin_run(self.out, self.spec.resume_from, self.start_step, self.init_checkpoint)
        accelerator.init_trackers("duolm", config={**self.run_config, **self.model_cfg.to_dict()})
        if redone and self.metrics.drop_after(self.start_step):
            self.log(f"dropped the metric records after step {self.start_step}, which it redoes")
        dtype = torch.bfloat16 if accelerator.mixed_precision == "bf16" else torch.float32
        self.meter = MfuMeter.for_run(self.device, dtype, cfg, self.say)
        self.log(
            f"{self.objective.name}: {self.n_parameters / 1e6:.2f}M parameters, "
            f"{self.data.n_train_rows} train rows x {cfg.seq_len}, {self.total_steps} steps, "
            f"{self.world} process(es) ({self.layout}), "
            f"micro-batch {self.micro_batch} x {cfg.grad_accum} accumulation, "
            f"precision {precision_name(accelerator.mixed_precision)}, "
            f"peak {self.meter.peak / 1e12:.3g} TFLOP/s ({self.meter.source})"
        )
        step_flops = self.flops_token * self.tokens_per_step / self.world
        warn_if_slow(step_flops, self.meter.peak, self.total_steps - self.start_step, self.log)
        # a run resumed in its own folder inherits branched_from but is no new branch
        branch_of = str(self.spec.resume_from) if self.spec.is_branch else None
        for line in schedule_notes(self.schedules, self.start_step, self.total_steps, branch_of):
            self.log(line)

    def run_record(self) -> dict[str, Any]:
        """What defines the run and where its weights came from (config.json, checkpoints)."""
        return {
            "model_config": self.model_cfg.to_dict(),
            "train_config": self.run_config,
            "data": self.data.record,
            "init_from": self.init_record,
            "branched_from": self.branched_from,
            "preset": self.spec.preset,
        }

    def checkpoint_keeper(self) -> keeping.CheckpointKeeper:
        record = self.run_record() | {
            "objective": self.objective.name,
            "total_steps": self.total_steps,
            "schedule_history": self.schedules,
        }
        return keeping.CheckpointKeeper(
            self.out / "checkpoints",
            self.accelerator,
            tokenizer=self.tokenizer,
            record=record,
            keep_last=self.cfg.keep_checkpoints,
            resumed_from=self.spec.resume_from,
            keep_steps=self.branch_points,
            checkpoint_format=keeping.format_for(self.cfg, self.layout, self.n_parameters),
        )

    # ------------------------------------------------------------------------- the loop
    def fit(self, stop: StopRequest) -> None:
        """Steps from the start step to the budget (or ``stop_after_steps`` sooner, or a stop
        request), with logging, periodic and curve validations and checkpoints after each."""
        cfg = self.cfg
        if cfg.stop_after_steps:
            self.end_step = min(self.total_steps, self.start_step + cfg.stop_after_steps)
        self.model.train()
        self.progress = tqdm(
            initial=self.start_step,
            total=self.total_steps,
            disable=not self.accelerator.is_local_main_process,
            desc=self.objective.name,
            dynamic_ncols=True,
        )
        # Throughput counts training steps only: each step's time is added to the window, so the
        # validations and checkpoints between steps never enter tokens/s or MFU.
        window = [0, 0.0]  # tokens, seconds
        stop.on_stop = "saving a checkpoint at the end of this step"
        with self.progress:  # closed (its last line drawn) before any error is printed
            for step in range(self.start_step, self.end_step):
                started = time.perf_counter()
                result = self.train_step(step, stop)
                done = step + 1
                self.progress.update()  # before the step's log, validation and checkpoint name it
                self.count_bad_steps(done, result)
                window[0] += self.tokens_per_step
                window[1] += time.perf_counter() - started
                if done % cfg.log_every == 0 or done == self.end_step:
                    self.log_train(done, result, *window)
                    window = [0, 0.0]
                evaluated = self.validate_on_schedule(done)
                if result.stop_requested:
                    self.stopped_by = stop.signal_name or "a signal to another process"
                    self.end_step = done
                periodic = done % (cfg.checkpoint_every or cfg.eval_every) == 0
                if periodic or done == self.end_step or done in self.branch_points:
                    # the data position goes with the checkpoint's record (state.json)
                    self.keeper.record["data_position"] = self.order.position(done)
                    self.keeper.save(
                        done,
                        evaluated,
                        self.model,
                        self.optimizer.optimizer,
                        self.scheduler,
                        healthy=self.bad_streak == 0,
                        announce=self.say,
                    )
                if self.stopped_by:
                    self.say(f"stopped by {self.stopped_by} at step {done} (checkpoint saved)")
                    break

    def say(self, message: str) -> None:
        """A line above the progress bar, once per run rather than once per process."""
        if self.accelerator.is_main_process:
            self.progress.write(message)

    def count_bad_steps(self, done: int, result: StepResult) -> None:
        """Record a skipped update; stop the run after ``max_bad_steps`` of them in a row."""
        if result.applied:
            self.bad_streak = 0
            return
        self.bad_streak += 1
        self.skipped_steps += 1
        self.metrics.log(
            {
                "step": done,
                "kind": "skipped",
                "loss": result.loss,
                "grad_norm": result.grad_norm,
                "skipped_steps": self.skipped_steps,
            }
        )
        self.say(
            f"step {done}: non-finite loss {result.loss} or gradient norm {result.grad_norm}; "
            f"update skipped ({self.bad_streak} in a row)"
        )
        if self.bad_streak >= self.cfg.max_bad_steps:
            last_good = self.keeper.last_good or "none (no checkpoint was written yet)"
            raise TrainingDiverged(
                f"stopping at step {done}: {self.bad_streak} consecutive steps with a non-finite "
                f"loss or gradient (last loss {result.loss}, gradient norm {result.grad_norm}); "
                f"the last good checkpoint is {last_good}"
            )

    def log_train(self, done: int, result: StepResult, tokens: int, seconds: float) -> None:
        """A training record: the step's loss and the throughput of the steps since the last."""
        tokens_per_s = tokens / seconds
        self.throughput.append(tokens_per_s)
        mfu = self.meter(tokens_per_s * self.flops_token)
        self.metrics.log(
            {
                "step": done,
                "kind": "train",
                "loss": result.loss,
                "lr": self.scheduler.get_last_lr()[0],
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
                "window_tokens": tokens,
                "window_seconds": seconds,
                "tokens": done * self.tokens_per_step,
                "grad_norm": result.grad_norm,
                "skipped_steps": self.skipped_steps,
            }
        )
        self.progress.set_postfix(
            loss=f"{result.loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", mfu=f"{mfu:.1%}", refresh=False
        )

    def finish(self) -> dict[str, Any]:
        """The summary (with the final validation on the whole split when the budget is done),
        written to final.json."""
        summary = self.summary()
        if summary["finished"]:
            final = self.validate(self.end_step, None)  # the whole validation split
            self.metrics.log(final)
            summary.update(final)
            self.log(
                f"final: val {self.objective.metric} {final['val_nats_per_token']:.4f} nats/token "
                f"(ppl {final['val_ppl']:.2f}), {final['val_bpb']:.4f} bits/byte over "
                f"{final['val_tokens']} tokens"
            )
        if self.accelerator.is_main_process:
            end_run(self.out, self.end_step)  # a training file edited meanwhile: a dirty run
            write_json_atomic(self.out / "final.json", summary, durable=False)
        return summary

    def summary(self) -> dict[str, Any]:
        """What the run did and how fast, without the final validation."""
        rates = self.throughput or self.metrics.train_rates()
        return {
            "objective": self.objective.name,
            "metric": self.objective.metric,
            "step": self.end_step,
            "start_step": self.start_step,  # this invocation's: the steps before it were earlier
            "total_steps": self.total_steps,
            "schedule_history": self.schedules,
            "finished": self.end_step == self.total_steps,
            "stopped_by": self.stopped_by,
            "skipped_steps": self.skipped_steps,
            "best_checkpoint": self.keeper.best,
            "parameters": self.n_parameters,
            "tokens_seen": self.end_step * self.tokens_per_step,
            "flops_per_token": self.flops_token,
            "train_tokens_per_s": steady_rate(rates),
            "peak_flops": self.meter.peak,
            "peak_flops_source": self.meter.source,
            "processes": self.world,
            "parallel_layout": self.layout,
            "precision": precision_name(self.accelerator.mixed_precision),
            "compiled": self.compiled,
            **peak_memory(self.device),
            "train_rows": self.data.n_train_rows,
            "epochs_seen": self.end_step * self.cfg.batch_size / self.data.n_train_rows,
            "data": self.data.record,
            "init_from": self.init_record,
            "branched_from": self.branched_from,
        }
