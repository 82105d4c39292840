"""Learning curves on one compute axis, and what they say about AR vs diffusion.

Pure functions on lists of (training FLOPs, validation loss) points, so each can be checked
against a hand-computed answer:

* ``geometric_budgets``: where along the FLOP axis both objectives are evaluated;
* ``flops_to_reach``: the compute a curve needs to reach a loss, interpolated linearly in
  log-FLOPs vs log-loss between the two points that bracket it ("not reached" beyond the curve);
* ``compute_multipliers``: for each AR point, the MDM's compute to match its loss, over the AR's
  (Nie et al. 2024 report about 16x); ``headline_multiplier`` picks the largest AR budget the MDM
  reaches, with an interval from the MDM curve's 95% band;
* ``fit_power_law``: L(C) = E + A * C^-alpha;
* ``unigram_entropy``: the floor every model must beat, the exact entropy of the training
  split's token frequencies;
* ``select_learning_rate``: the per-objective tuning rule (lowest validation loss; diverged runs
  labelled, never chosen).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import curve_fit

from shared.errors import ConfigError

# A point of a learning curve: (training FLOPs, validation nats/token).
Point = tuple[float, float]


def geometric_budgets(first: float, last: float, count: int) -> list[float]:
    """``count`` FLOP budgets from ``first`` to ``last``, evenly spaced in log."""
    if count < 2:
        raise ConfigError(f"a learning curve needs at least 2 budgets; got count={count}")
    if not 0 < first < last:
        raise ConfigError(f"budgets must satisfy 0 < first < last; got {first:g} and {last:g}")
    return [float(v) for v in np.geomspace(first, last, count)]


def check_increasing(budgets: Sequence[float]) -> list[float]:
    """A budget list as given by a user: positive and strictly increasing."""
    values = [float(b) for b in budgets]
    if len(values) < 2:
        raise ConfigError(f"a learning curve needs at least 2 budgets; got {values}")
    if values[0] <= 0 or any(b <= a for a, b in zip(values, values[1:])):
        raise ConfigError(f"budgets must be positive and strictly increasing; got {values}")
    return values


def flops_to_reach(curve: Sequence[Point], target: float) -> float | None:
    """The compute at which ``curve`` (sorted by FLOPs) first reaches ``target`` loss, or None.

    Between two points the curve is a straight line in log-FLOPs vs log-loss (a power law); a
    target at or above the first point's loss is reached at the first point's compute (the curve
    says no more), and one below every point is not reached."""
    points = sorted(curve)
    if not points:
        return None
    if points[0][1] <= target:
        return points[0][0]
    for (c0, l0), (c1, l1) in zip(points, points[1:]):
        if l1 <= target < l0:
            fraction = (math.log(target) - math.log(l0)) / (math.log(l1) - math.log(l0))
            return math.exp(math.log(c0) + fraction * (math.log(c1) - math.log(c0)))
    return None


@dataclass(frozen=True)
class Multiplier:
    ar_flops: float
    ar_loss: float
    mdm_flops: float | None  # None: the MDM curve never reaches the AR's loss

    @property
    def value(self) -> float | None:
        return None if self.mdm_flops is None else self.mdm_flops / self.ar_flops


def compute_multipliers(ar: Sequence[Point], mdm: Sequence[Point]) -> list[Multiplier]:
    """For each AR point, the MDM compute that reaches the same validation loss."""
    return [Multiplier(c, loss, flops_to_reach(mdm, loss)) for c, loss in sorted(ar)]


@dataclass(frozen=True)
class Headline:
    """The multiplier at the largest AR budget the MDM reaches, with the interval that the MDM
    curve's 95% band implies (its lower band reaches the loss sooner, its upper band later)."""

    ar_flops: float
    value: float
    low: float | None
    high: float | None  # None: the upper band does not reach the loss (open interval)


def headline_multiplier(
    ar: Sequence[Point],
    mdm: Sequence[Point],
    mdm_low: Sequence[Point] | None = None,
    mdm_high: Sequence[Point] | None = None,
) -> Headline | None:
    """None when the MDM reaches no AR point's loss (fewer than two shared loss levels)."""
    reached = [m for m in compute_multipliers(ar, mdm) if m.value is not None]
    if not reached:
        return None
    last = max(reached, key=lambda m: m.ar_flops)

    def ratio(curve: Sequence[Point] | None) -> float | None:
        flops = flops_to_reach(curve, last.ar_loss) if curve else None
        return None if flops is None else flops / last.ar_flops

    return Headline(last.ar_flops, last.value, ratio(mdm_low), ratio(mdm_high))


@dataclass(frozen=True)
class PowerLaw:
    E: float  # irreducible loss
    A: float
    alpha: float
    scale: float  # C is measured in units of this many FLOPs (the first point's)
    rms: float  # root-mean-square residual, nats/token

    def __call__(self, flops: float) -> float:
        return self.E + self.A * (flops / self.scale) ** -self.alpha


def fit_power_law(curve: Sequence[Point], min_points: int = 4) -> PowerLaw | None:
    """Least-squares fit of L(C) = E + A C^-alpha (E >= 0, A > 0, alpha > 0); None with fewer
    than ``min_points`` points or when the fit does not converge."""
    points = sorted(curve)
    if len(points) < min_points:
        return None
    flops = np.array([c for c, _ in points])
    loss = np.array([v for _, v in points])
    scale = float(flops[0])
    x = flops / scale

    def law(x, E, A, alpha):
        return E + A * x ** (-alpha)

    start = (0.5 * loss.min(), max(loss[0] - 0.5 * loss.min(), 1e-3), 0.3)
    try:
        (E, A, alpha), _ = curve_fit(
            law, x, loss, p0=start, bounds=([0, 0, 0], [loss.min(), np.inf, 5]), maxfev=20000
        )
    except (RuntimeError, ValueError):
        return None
    rms = float(np.sqrt(np.mean((law(x, E, A, alpha) - loss) ** 2)))
    return PowerLaw(float(E), float(A), float(alpha), scale, rms)


def unigram_entropy(rows: np.ndarray, pad_id: int) -> float:
    """Entropy in nats of the token frequencies over the loss positions of ``rows`` (position 0
    is BOS; padding is not data): the loss of the best model that ignores context."""
    targets = np.asarray(rows)[:, 1:]
    return entropy_of_counts(np.bincount(targets[targets != pad_id].ravel()))


def entropy_of_counts(counts: np.ndarray) -> float:
    """Entropy in nats of the distribution proportional to ``counts``."""
    total = counts.sum()
    if total == 0:
        raise ConfigError("no loss positions: cannot compute a unigram entropy")
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


@dataclass(frozen=True)
class LearningRateChoice:
    chosen: float
    table: list[dict]  # one row per learning rate: lr, loss (None if diverged), diverged


def select_learning_rate(losses: dict[float, float]) -> LearningRateChoice:
    """The learning rate with the lowest validation loss among the runs that stayed finite."""
    table = [
        {
            "lr": lr,
            "loss": loss if math.isfinite(loss) else None,
            "diverged": not math.isfinite(loss),
        }
        for lr, loss in sorted(losses.items())
    ]
    finite = [row for row in table if not row["diverged"]]
    if not finite:
        raise ConfigError(
            f"every learning rate of the sweep diverged ({sorted(losses)}); try smaller ones"
        )
    best = min(finite, key=lambda row: row["loss"])
    return LearningRateChoice(best["lr"], table)
