"""A setting's speed as a ratio to the AR's, measured in the same rounds and replicated over
fresh processes: the frontier's speed, the quantity its headline ranks by and states an interval
for, and what ``eval.speed.throughput_runs`` checks a rerun against.

    ratios = process_ratios(throughput, "mdm ancestral 8 steps", batch_size=1)   # one per process
    estimate = ratio_estimate([ratios])   # geometric mean and 95% t-interval over the processes
    estimate.holds(rerun.mean, rerun.count)   # a rerun inside the interval predicted for it

Why ratios: the absolute tokens/s of one host drift by 10-25% between fresh processes minutes
apart (docs/studies/throughput-repeats), and the AR's rounds drift with the setting's, so the
ratio of the two in the same round moves far less. Why per round: within one process, each round
runs every setting once (``eval.speed.throughput.measure``), so a setting's tokens/s over the AR's
in that round shares the round's state of the host; the process's ratio is the median over its
rounds. Why over processes: a round-to-round spread inside one process does not cover what
changes from one fresh process to the next (a process's own thread placement, allocator and
caches), so the interval is a 95% Student-t interval over the processes' ratios (with several
seeds: over the seeds' means, each the mean over that seed's processes, as the seed is then the
unit that was replicated). Why logs: a ratio's noise is multiplicative (a process that runs the
setting 10% slower moves its ratio by a factor, whatever the ratio), and 2x and 0.5x must
average to 1x; so every mean here is geometric and every interval is a t-interval of the log
ratios mapped back, as the budget multiplier M is (``eval.budgets.seed_spread``).

Why a prediction interval for reruns: the 95% interval for the first run's mean says where the
true ratio lies; a rerun's mean carries its own noise besides, so a perfectly reproducible
setting would land outside that interval far more often than 5% of the time (with 3 processes a
side, about 9%). A rerun over n2 replicates is judged against the two-sample prediction interval
for its mean, exp(m1 +- t(0.975, n1 - 1) * s1 * sqrt(1/n1 + 1/n2)), with m1 and s1 the mean and
standard deviation of the first run's n1 log ratios: (m2 - m1) / (s1 * sqrt(1/n1 + 1/n2)) follows
Student's t with n1 - 1 degrees of freedom when both runs draw from one log-normal process, so a
setting that reproduces lands inside 95% of the time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from eval.budgets import seed_spread
from eval.speed.throughput import Record, Throughput

# The AR setting every ratio is taken to: its untempered samples.
REFERENCE = "ar T=1"
# How often a rerun of a setting that reproduces lands inside its interval (``rerun_interval``).
RERUN_LEVEL = 0.95


def round_ratios(run: Throughput, name: str, batch_size: int, reference: str = REFERENCE):
    """Per timed round of one process's ``run``: the setting's tokens/s over the reference's in
    that round. Raises KeyError when either was not measured at ``batch_size`` or kept no timed
    rounds (no ratio to take: measured as not measured), ValueError when their rounds differ in
    number (not one measurement)."""
    setting, ar = run.record(name, batch_size), run.record(reference, batch_size)
    for record in (setting, ar):
        if not record.round_seconds:
            raise KeyError(f"{record.name!r} kept no timed rounds at batch {batch_size}")
    if len(setting.round_seconds) != len(ar.round_seconds):
        raise ValueError(
            f"{name!r} ran {len(setting.round_seconds)} rounds and {reference!r} "
            f"{len(ar.round_seconds)} at batch {batch_size}: not timed in the same rounds"
        )
    return [speed / reference_speed for speed, reference_speed in zip(speeds(setting), speeds(ar))]


def speeds(record: Record) -> list[float]:
    """Tokens/s of each timed round."""
    return [tokens / seconds for tokens, seconds in zip(record.round_tokens, record.round_seconds)]


def process_ratios(
    throughput: Throughput, name: str, batch_size: int, reference: str = REFERENCE
) -> list[float]:
    """One ratio per measuring process (the median of its round ratios, taken on logs so that
    an even number of rounds gives the geometric midpoint): over the processes a pooled
    measurement kept, or the one run a measurement is."""
    runs = throughput.processes or [throughput]
    return [geometric_median(round_ratios(run, name, batch_size, reference)) for run in runs]


def geometric_median(ratios: Sequence[float]) -> float:
    return math.exp(statistics.median(math.log(r) for r in ratios))


def geometric_mean(ratios: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


SINGULAR = {"processes": "process", "seeds": "seed"}


@dataclass(frozen=True)
class RatioEstimate:
    """The geometric mean ratio over ``count`` replicates (``over``: "processes" or "seeds") with
    its 95% Student-t interval, both taken on the log ratios (None below two replicates), and
    the standard deviation of those log ratios (``log_sd``, None below two)."""

    mean: float
    interval: tuple[float, float] | None
    count: int
    over: str
    log_sd: float | None = None

    def text(self) -> str:
        """``3.1x (95% t-interval [2.9, 3.3] over 3 processes)``."""
        if self.interval is None:
            return f"{self.mean:.3g}x (1 {SINGULAR[self.over]}, no interval)"
        low, high = self.interval
        return (
            f"{self.mean:.3g}x (95% t-interval [{low:.3g}, {high:.3g}] over {self.count} "
            f"{self.over})"
        )

    def rerun_interval(self, count: int, level: float = RERUN_LEVEL) -> tuple[float, float] | None:
        """Where a rerun's geometric mean over ``count`` replicates lies with probability
        ``level`` when nothing changed: exp(m1 +- t((1 + level) / 2, n1 - 1) * s1 *
        sqrt(1/n1 + 1/count)) on the log ratios (the module docstring); None without a spread
        (one replicate)."""
        if self.log_sd is None:
            return None
        t = float(stats.t.ppf((1 + level) / 2, self.count - 1))
        half = t * self.log_sd * math.sqrt(1 / self.count + 1 / count)
        return self.mean * math.exp(-half), self.mean * math.exp(half)

    def holds(self, value: float, count: int, level: float = RERUN_LEVEL) -> bool:
        """Whether a rerun's ratio ``value`` (its mean over ``count`` replicates) lies inside
        ``rerun_interval`` (False without one)."""
        interval = self.rerun_interval(count, level)
        return interval is not None and interval[0] <= value <= interval[1]


def ratio_estimate(per_seed: Sequence[Sequence[float]]) -> RatioEstimate:
    """The estimate from each seed's process ratios: over the processes with one seed, over the
    seeds' geometric means with several."""
    groups = [list(values) for values in per_seed if values]
    if not groups:
        raise ValueError("no ratios: give at least one process's ratio")
    if len(groups) == 1:
        values, over = groups[0], "processes"
    else:
        values, over = [geometric_mean(group) for group in groups], "seeds"
    spread = seed_spread(values, geometric=True)
    interval = None if spread is None or spread.low is None else (spread.low, spread.high)
    log_sd = statistics.stdev(math.log(v) for v in values) if len(values) > 1 else None
    return RatioEstimate(spread.mean, interval, len(values), over, log_sd)
