"""The compute multiplier from budget points, as the scaling literature measures it.

A *budget point* is one run scheduled for its own compute budget (a WSD run, or a cooldown branch
of a longer one: the same thing step for step, ``shared.training.schedule``) and validated at its
end. The points of one objective and seed form its loss-vs-compute frontier; the multiplier at a
loss L is the compute the MDM's frontier needs to reach L over the AR's:

    M(L) = C_MDM(L) / C_AR(L)

read only where both frontiers cover L (interpolated linearly in log-compute vs log-loss between
the two points that bracket it; never extrapolated), and only from points that are past the
unigram plateau. Pure functions, each checked against hand-computed answers in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from shared.errors import ConfigError

# A budget point: (training FLOPs, validation nats/token).
Point = tuple[float, float]

# How a report picks the loss its headline multiplier is read at, fixed before the run.
HEADLINE_RULES = {
    "mdm_largest": "the MDM's validation loss at its largest budget",
    "ar_smallest": "the AR's validation loss at its smallest budget",
}


def past_plateau(points: Sequence[Point], unigram: float, margin: float) -> list[Point]:
    """The points whose loss is more than ``margin`` nats below the unigram entropy: a model
    still on the unigram plateau has not learned the context, and its compute measures how long it
    took to leave the plateau, not a compute gap."""
    return sorted((c, loss) for c, loss in points if loss < unigram - margin)


def flops_at(points: Sequence[Point], loss: float) -> float | None:
    """The compute at which the frontier ``points`` reaches ``loss``: interpolated linearly in
    log-compute vs log-loss between the first pair of consecutive points that brackets it; None
    outside the frontier's loss range (no extrapolation)."""
    ordered = sorted(points)
    for (c0, l0), (c1, l1) in zip(ordered, ordered[1:]):
        if min(l0, l1) <= loss <= max(l0, l1):
            if l0 == l1:
                return c0
            fraction = (math.log(loss) - math.log(l0)) / (math.log(l1) - math.log(l0))
            return math.exp(math.log(c0) + fraction * (math.log(c1) - math.log(c0)))
    if len(ordered) == 1 and ordered[0][1] == loss:
        return ordered[0][0]
    return None


def multiplier_at(ar: Sequence[Point], mdm: Sequence[Point], loss: float) -> float | None:
    """M(loss) = C_MDM(loss) / C_AR(loss); None where either frontier does not cover ``loss``."""
    ar_flops, mdm_flops = flops_at(ar, loss), flops_at(mdm, loss)
    if ar_flops is None or mdm_flops is None:
        return None
    return mdm_flops / ar_flops


def shared_losses(ar: Sequence[Point], mdm: Sequence[Point]) -> tuple[float, float] | None:
    """(lowest, highest) loss both frontiers cover; None when they do not overlap."""
    if len(ar) < 2 or len(mdm) < 2:
        return None
    low = max(min(v for _, v in ar), min(v for _, v in mdm))
    high = min(max(v for _, v in ar), max(v for _, v in mdm))
    return (low, high) if low <= high else None


def multiplier_curve(ar: Sequence[Point], mdm: Sequence[Point], count: int = 9) -> list[Point]:
    """(loss, M(loss)) at ``count`` losses spaced evenly in log over the shared range."""
    span = shared_losses(ar, mdm)
    if span is None:
        return []
    losses = np.geomspace(span[0], span[1], count) if span[0] < span[1] else [span[0]]
    curve = [(float(loss), multiplier_at(ar, mdm, float(loss))) for loss in losses]
    return [(loss, m) for loss, m in curve if m is not None]


def headline_loss(rule: str, ar: Sequence[Point], mdm: Sequence[Point]) -> float | None:
    """The loss level the headline multiplier is read at under ``rule`` (``HEADLINE_RULES``)."""
    if rule not in HEADLINE_RULES:
        raise ConfigError(f"headline rule {rule!r} is not one of {sorted(HEADLINE_RULES)}")
    if not ar or not mdm:
        return None
    if rule == "mdm_largest":
        return max(mdm)[1]
    return min(ar)[1]


@dataclass(frozen=True)
class LogLogFit:
    """L(C) = A * C^-alpha fitted by least squares on log L vs log C: ``alpha`` is the
    frontier's scaling exponent. Equal exponents for both objectives mean a constant multiplier
    (parallel scaling, as SMDM reports)."""

    alpha: float
    log_a: float
    rms: float  # root-mean-square residual of log L

    def flops_at(self, loss: float) -> float:
        return math.exp((self.log_a - math.log(loss)) / self.alpha)


def fit_log_log(points: Sequence[Point], min_points: int = 4) -> LogLogFit | None:
    """The log-log fit of a frontier with at least ``min_points`` points and a falling loss;
    None otherwise."""
    if len(points) < min_points:
        return None
    log_c = np.log([c for c, _ in points])
    log_l = np.log([v for _, v in points])
    slope, intercept = np.polyfit(log_c, log_l, 1)
    if slope >= 0:
        return None
    residual = log_l - (intercept + slope * log_c)
    return LogLogFit(float(-slope), float(intercept), float(np.sqrt(np.mean(residual**2))))


@dataclass(frozen=True)
class SeedSpread:
    """A quantity measured once per training seed: the per-seed values, their mean and its 95%
    Student-t interval over seeds (None with one seed). ``geometric``: for ratios, the mean and
    interval are taken on log values and mapped back."""

    values: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None
    geometric: bool

    def text(self, digits: int = 3, unit: str = "") -> str:
        value = f"{self.mean:.{digits}g}{unit}"
        if self.low is None:
            return f"{value} (one seed: no interval over seeds)"
        return f"{value} [{self.low:.{digits}g}{unit}, {self.high:.{digits}g}{unit}]"


def seed_spread(values: Sequence[float], geometric: bool = False) -> SeedSpread | None:
    """The mean over seeds with a 95% t-interval (n >= 2); None without values."""
    if not values:
        return None
    xs = np.log(values) if geometric else np.asarray(values, dtype=float)
    n, mean = len(xs), float(np.mean(xs))
    back = math.exp if geometric else float
    if n < 2:
        return SeedSpread(tuple(values), back(mean), None, None, geometric)
    half = float(stats.t.ppf(0.975, n - 1) * np.std(xs, ddof=1) / math.sqrt(n))
    return SeedSpread(tuple(values), back(mean), back(mean - half), back(mean + half), geometric)
