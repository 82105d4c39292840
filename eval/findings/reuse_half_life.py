"""The data-reuse half-life R* of Muennighoff et al. 2023 ("Scaling Data-Constrained Language
Models"), as the data-constrained finding measures it: what each epoch of repeated data is worth
in fresh-data epochs, read off a fresh-data run's curve, and R* fitted to those points."""

from __future__ import annotations

import math
from typing import Any

from scipy import optimize

from eval.budgets import flops_at


def best_point(curve: list[dict[str, Any]]) -> dict[str, Any]:
    return min(curve, key=lambda r: r["val_nats_per_token"])


def effective_epochs(
    repeated: list[dict[str, Any]], fresh: list[dict[str, Any]]
) -> list[tuple[float, float]]:
    """(epochs trained, effective epochs) of each repeated-data validation up to its best: the
    fresh-data epochs (tokens / unique tokens) that reach the same loss on the fresh run's curve
    (log-log interpolation, no extrapolation)."""
    fresh_points = [(r["epoch"], r["val_nats_per_token"]) for r in fresh]
    best = best_point(repeated)["step"]
    out = []
    for r in repeated:
        if r["step"] > best:
            break
        worth = flops_at(fresh_points, r["val_nats_per_token"])
        if worth is not None:
            out.append((r["epoch"], worth))
    return out


def fit_half_life(points: list[tuple[float, float]], bound: float = 1e4) -> dict[str, Any] | None:
    """Muennighoff et al.'s data-reuse half-life R*: the effective epochs of E epochs of unique
    data are 1 + R* (1 - exp(-(E - 1) / R*)) (each repetition worth less, decaying with scale
    R*), fitted by least squares on the points with E > 1. ``at_bound``: the fit ran into
    ``bound`` (no saturation seen: R* is at least the largest repetition count)."""
    usable = [(e - 1, w - 1) for e, w in points if e > 1]
    if len(usable) < 2:
        return None

    def loss(log_r: float) -> float:
        r = math.exp(log_r)
        return sum((y - r * (1 - math.exp(-x / r))) ** 2 for x, y in usable)

    fit = optimize.minimize_scalar(loss, bounds=(math.log(0.05), math.log(bound)), method="bounded")
    value = math.exp(fit.x)
    return {"r_star": value, "at_bound": value > 0.99 * bound, "points": len(usable)}
