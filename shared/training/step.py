"""The training step, a component of ``shared.training.trainer.Trainer``: one optimizer step's
rows and noise (pure functions of the seed and the step), its gradients over this process's
micro-batches, and the update, skipped when the loss or the gradient is not finite."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from shared.faults import StopRequest, fault_active, hold_step_if, run_out_of_memory_if
from shared.objective import annealing_noise, loss_positions, slice_noise
from shared.training.schedule import batch_generator, objective_step_noise


@dataclass
class StepResult:
    """One optimizer step's loss, gradient norm, whether it updated, and any stop request."""

    loss: float
    grad_norm: float
    applied: bool
    stop_requested: bool


class TrainingStep:
    """``train_step`` for the trainer (it reads the trainer's config, data order, objective,
    model, optimizer and scheduler)."""

    def train_step(self, step: int, stop: StopRequest) -> StepResult:
        """Optimizer step ``step`` (0-based): its rows and noise (pure functions of the seed and
        the step), the gradients over the micro-batches of this process, and the update, which
        is skipped when the loss or the gradient is not finite."""
        cfg = self.cfg
        hold_step_if(step + 1)
        run_out_of_memory_if("oom_in_step", step + 1)
        rows = self.order.rows(step)
        generator = batch_generator(cfg.seed, step)
        noise = self.objective.sample_noise(len(rows), rows.shape[1], generator)
        noise |= annealing_noise(
            cfg.attention_anneal_steps, step, len(rows), generator, self.model_cfg.sliding_window
        ) | objective_step_noise(self.objective, step, len(rows), generator)
        scored = self.scored
        step_scored = (
            loss_positions(rows, self.tokenizer.pad_id) if scored is None else scored(rows)
        )
        global_tokens = max(int(step_scored.sum()), 1)  # the normaliser of every micro-batch
        step_nats = self.accumulate_gradients(step, rows, noise, step_scored, global_tokens)
        # One reduction per step carries the loss and any stop request, so every process takes
        # the same decision (skip, stop, save) at the same step.
        requested = torch.tensor(float(stop.requested), device=self.device).double()
        shared_state = self.accelerator.reduce(torch.stack([step_nats, requested]), "sum")
        loss = float(shared_state[0]) / global_tokens
        clip = cfg.grad_clip or float("inf")
        grad_norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), clip))
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if applied:
            self.optimizer.step()
        # A skipped update still moves the schedule and the data order, so a later resume lines
        # up step for step.
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, grad_norm, applied, float(shared_state[1]) > 0)

    def accumulate_gradients(
        self, step, rows, noise, step_scored, global_tokens: int
    ) -> torch.Tensor:
        """Backpropagate this process's micro-batches of the step; returns their summed nats.
        Each loss is scaled by world / global_tokens, so the gradient is the same for any split
        of the batch over processes (DDP averages over them) and micro-steps."""
        cfg, micro_batch = self.cfg, self.micro_batch
        step_nats = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(cfg.grad_accum):
            start = (self.rank * cfg.grad_accum + micro) * micro_batch
            batch = rows[start : start + micro_batch].to(self.device)
            last_micro = micro == cfg.grad_accum - 1
            no_sync = self.accelerator.no_sync(self.model)
            with no_sync if not last_micro else contextlib.nullcontext():
                micro_noise = slice_noise(noise, start, start + micro_batch)
                micro_scored = None
                if self.scored is not None:
                    micro_scored = step_scored[start : start + micro_batch].to(self.device)
                out_loss = self.objective.loss(self.model, batch, micro_noise, micro_scored)
                if fault_active("nan_loss", step + 1):
                    out_loss.nats = out_loss.nats * float("nan")
                self.accelerator.backward(out_loss.nats * self.world / global_tokens)
            step_nats += out_loss.nats.detach().double()
        return step_nats
