"""How long a run trains and how its learning rate moves, as pure functions of the step."""

from __future__ import annotations

import math

import numpy as np
import torch

from shared.training.config import TrainConfig
from shared.validation import noise_generator


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` (or constant)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


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
