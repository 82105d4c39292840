"""Fair tuning: each objective gets its own learning rate, chosen by a small sweep (a log grid
around the preset's value, short runs at a fraction of the budget, selection on validation loss
by ``eval.curves.select_learning_rate``). Runs are kept under ``<out>/tune/`` and reused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eval.curves import select_learning_rate
from eval.experiments.stages import OBJECTIVES, train_or_reuse
from shared.training import TrainingDiverged, resolve_config

BUDGET_FIELDS = ("max_steps", "max_tokens", "max_flops", "epochs")


def short_budget(preset: str, overrides: dict[str, Any], fraction: float) -> dict[str, Any]:
    """The active budget field of the main runs, scaled by ``fraction``."""
    _, cfg = resolve_config(preset, overrides)
    for name in ("max_flops", "max_tokens", "epochs"):
        if getattr(cfg, name):
            return {name: getattr(cfg, name) * fraction}
    return {"max_steps": max(1, math.ceil(cfg.max_steps * fraction))}


def tune_learning_rates(
    preset: str,
    out: Path,
    overrides: dict[str, Any],
    factors: tuple[float, ...],
    fraction: float,
    force: bool,
    objectives: tuple[str, ...] = OBJECTIVES,
) -> dict[str, Any]:
    """{objective: {"chosen": lr, "table": [...]}} over ``factors`` x the preset's learning
    rate; a run that diverges is labelled, never chosen."""
    _, cfg = resolve_config(preset, overrides)
    short = short_budget(preset, overrides, fraction)
    settings = {k: v for k, v in overrides.items() if k not in (*BUDGET_FIELDS, "lr")}
    settings |= short | {"curve_points": 0}
    results: dict[str, Any] = {"base_lr": cfg.lr, "budget": short}
    for objective in objectives:
        losses: dict[float, float] = {}
        for factor in factors:
            lr = cfg.lr * factor
            run = out / "tune" / f"{objective}-lr{lr:.3g}"
            try:
                summary = train_or_reuse(
                    f"{objective} lr={lr:.3g}",
                    run,
                    preset,
                    {"objective": objective},
                    settings | {"lr": lr},
                    force,
                )
                losses[lr] = summary["val_nats_per_token"]
            except TrainingDiverged:
                losses[lr] = math.inf
        choice = select_learning_rate(losses)
        results[objective] = {"chosen": choice.chosen, "table": choice.table}
    return results
