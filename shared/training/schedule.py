"""How long a run trains and how its learning rate moves, as pure functions of the step."""

from __future__ import annotations

import math

import numpy as np
import torch

from shared.errors import ConfigError
from shared.training.config import TrainConfig, parse_budgets
from shared.validation import noise_generator


def lr_multiplier(
    step: int,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: str,
    min_lr_ratio: float,
    cooldown_fraction: float = 0.2,
) -> float:
    """The learning rate of update ``step`` (0-based) as a fraction of the peak: a linear warmup
    to 1 over ``warmup_steps``, then

    * ``cosine``: a cosine decay to ``min_lr_ratio`` at ``total_steps``;
    * ``constant``: 1;
    * ``wsd`` (warmup-stable-decay): 1 until ``cooldown_start``, then a linear decay that reaches
      ``min_lr_ratio`` at the last update. Until its cooldown a WSD run's rates do not depend on
      its length, so a run of any shorter budget is a branch of a longer one (see
      ``cooldown_start``).
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        start = cooldown_start(total_steps, cooldown_fraction)
        if step < start:
            return 1.0
        progress = min(1.0, (step - start + 1) / (total_steps - start))
        return 1.0 - (1.0 - min_lr_ratio) * progress
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def cooldown_start(total_steps: int, cooldown_fraction: float) -> int:
    """The first step of a WSD run's cooldown: the last ``cooldown_fraction`` of its steps (at
    least one) decay. A run of ``total_steps`` branches off a longer WSD run's checkpoint at this
    step and is then step for step the run that was scheduled for ``total_steps`` from the
    start."""
    return total_steps - max(1, round(cooldown_fraction * total_steps))


def check_cooldown(cfg: TrainConfig, total_steps: int) -> None:
    """Refuse a WSD run whose cooldown would begin inside its warmup (its rate never reaches the
    stable phase: a budget point taken there measures the warmup, not the budget)."""
    if cfg.lr_schedule != "wsd":
        return
    start = cooldown_start(total_steps, cfg.cooldown_fraction)
    if start < cfg.warmup_steps:
        raise ConfigError(
            f"a wsd run of {total_steps} steps with cooldown_fraction={cfg.cooldown_fraction} "
            f"starts its cooldown at step {start}, inside its warmup of {cfg.warmup_steps} "
            "steps; raise the budget or lower --warmup-steps"
        )


def branch_points(cfg: TrainConfig, total_steps: int) -> set[int]:
    """The steps a WSD run checkpoints for its ``branch_budgets``: each budget's cooldown start."""
    if not cfg.branch_budgets:
        return set()
    budgets = parse_budgets(cfg.branch_budgets)
    too_long = [b for b in budgets if b >= total_steps]
    if too_long:
        raise ConfigError(
            f"branch_budgets {too_long} must be below this run's {total_steps} steps (a branch is "
            "a shorter budget)"
        )
    points = {cooldown_start(b, cfg.cooldown_fraction) for b in budgets}
    for budget in budgets:
        check_cooldown(cfg, budget)
    return points


def schedules_agree(cfg: TrainConfig, first_total: int, second_total: int, until_step: int) -> bool:
    """Whether runs of ``first_total`` and ``second_total`` steps under ``cfg``'s schedule take
    the same learning rate at every step before ``until_step`` (exactly: a continued or branched
    run is then the run scheduled for its budget from the start)."""

    def rates(total: int) -> list[float]:
        return [
            lr_multiplier(
                step,
                warmup_steps=cfg.warmup_steps,
                total_steps=total,
                schedule=cfg.lr_schedule,
                min_lr_ratio=cfg.min_lr_ratio,
                cooldown_fraction=cfg.cooldown_fraction,
            )
            for step in range(until_step)
        ]

    return first_total == second_total or rates(first_total) == rates(second_total)


def total_steps_for(cfg: TrainConfig, flops_per_step: float, n_rows: int) -> int:
    """The number of optimizer steps the run's budget buys: epochs over ``n_rows``, else FLOPs,
    else tokens, else ``max_steps``."""
    tokens_per_step = cfg.batch_size * cfg.seq_len
    if cfg.epochs:
        return max(1, math.ceil(cfg.epochs * n_rows / cfg.batch_size))
    if cfg.max_flops:
        return max(1, math.ceil(cfg.max_flops / flops_per_step))
    if cfg.max_tokens:
        return max(1, math.ceil(cfg.max_tokens / tokens_per_step))
    return cfg.max_steps


def curve_steps(total_steps: int, points: int, span: float = 64.0) -> list[int]:
    """Steps spaced evenly in log from ``total_steps / span`` to ``total_steps`` (so evenly in
    log-FLOPs, which grow linearly with steps): where a learning curve is measured."""
    if points < 1:
        return []
    first = max(1.0, total_steps / span)
    spaced = np.geomspace(first, total_steps, points) if points > 1 else [total_steps]
    return sorted({min(total_steps, max(1, round(float(s)))) for s in spaced})


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step ``step``'s diffusion noise: a pure function of (seed, step), so a
    resumed run draws exactly the noise the uninterrupted one would have."""
    return noise_generator(seed, step)


def fit_to_run(objective, total_steps: int, log) -> None:
    """Tell an objective whose training depends on the run's length (``set_run_length``, e.g.
    the uniform curriculum's default share of the steps) how many steps the run has, and
    ``log`` what it says about it."""
    set_run_length = getattr(objective, "set_run_length", None)
    for line in [] if set_run_length is None else set_run_length(total_steps):
        log(line)


def objective_step_noise(objective, step: int, n_rows: int, generator: torch.Generator) -> dict:
    """Noise an objective draws only at some training steps (``step_noise``, e.g. the uniform
    objective's curriculum), after every other draw of the step so the remaining steps draw
    exactly what they draw without it; {} for objectives without one."""
    step_noise = getattr(objective, "step_noise", None)
    return {} if step_noise is None else step_noise(step, n_rows, generator)
