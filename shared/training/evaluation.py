"""The evaluation loop, a component of ``shared.training.trainer.Trainer``: the validation loss
of the current weights, merged over processes, and the validations the schedule asks for
(periodic ones and the learning-curve points)."""

from __future__ import annotations

from typing import Any

from shared.validation import evaluate_rows


class Evaluation:
    """``validate`` and ``validate_on_schedule`` for the trainer (they read its config,
    validation rows, objectives, model and metrics)."""

    def validate(self, step: int, n_batches: int | None) -> dict[str, Any]:
        """The validation loss of the current weights, over ``n_batches`` global batches (None:
        the whole split), merged over processes."""
        cfg = self.cfg
        totals = evaluate_rows(
            self.model,
            self.eval_objective,
            self.data.val_rows,
            self.token_bytes,
            batch_size=cfg.batch_size,
            micro_batch=self.micro_batch,
            seed=cfg.eval_seed,
            device=self.device,
            pad_id=self.tokenizer.pad_id,
            n_batches=n_batches,
            rank=self.rank,
            world=self.world,
            scored=self.scored,
        )
        merged = totals.merged(lambda t: self.accelerator.reduce(t.to(self.device), "sum"))
        return {
            "step": step,
            "kind": "eval",
            "metric": self.objective.metric,
            **merged.as_dict("val"),
        }

    def validate_on_schedule(self, done: int) -> dict[str, Any] | None:
        """The periodic validation (every ``eval_every`` steps, on ``eval_batches``) and the
        learning-curve points; None at other steps. The budget's own step is validated on the
        whole split by ``finish``."""
        cfg = self.cfg
        periodic = done % cfg.eval_every == 0 and done != self.total_steps
        on_curve = done in self.curve_points_at
        if not (periodic or on_curve):
            return None
        evaluated = self.validate(done, cfg.eval_batches or None)
        evaluated["flops"] = done * self.flops_token * self.tokens_per_step
        evaluated["on_curve"] = on_curve
        self.metrics.log(evaluated)
        self.say(
            f"step {done}: val {self.objective.metric} "
            f"{evaluated['val_nats_per_token']:.4f} nats/token, "
            f"{evaluated['val_bpb']:.4f} bits/byte"
        )
        return evaluated
