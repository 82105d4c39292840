"""A setting's speed as a ratio to the AR's, measured in the same rounds and replicated over
fresh processes: the frontier's speed, the quantity its headline ranks by and states an interval
for, and what ``eval.speed.throughput_runs`` checks a rerun against.

    ratios = process_ratios(throughput, "mdm ancestral 8 steps", batch_size=1)   # one per process
    estimate = ratio_estimate([ratios])            # mean and 95% t-interval over the processes

Why ratios: the absolute tokens/s of one host drift by 10-25% between fresh processes minutes
apart (docs/studies/throughput-repeats), and the AR's rounds drift with the setting's, so the
ratio of the two in the same round moves far less. Why per round: within one process, each round
runs every setting once (``eval.speed.throughput.measure``), so a setting's tokens/s over the AR's
in that round shares the round's state of the host; the process's ratio is the median over its
rounds. Why over processes: a round-to-round spread inside one process does not cover what
changes from one fresh process to the next (a process's own thread placement, allocator and
caches), so the interval is a 95% Student-t interval over the processes' ratios (with several
seeds: over the seeds' means, each the mean over that seed's processes, as the seed is then the
unit that was replicated).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from eval.budgets import seed_spread
from eval.speed.throughput import Record, Throughput

# The AR setting every ratio is taken to: its untempered samples.
REFERENCE = "ar T=1"


def round_ratios(run: Throughput, name: str, batch_size: int, reference: str = REFERENCE):
    """Per timed round of one process's ``run``: the setting's tokens/s over the reference's in
    that round. Raises KeyError when either was not measured at ``batch_size``, ValueError when
    their rounds differ in number (not one measurement)."""
    setting, ar = run.record(name, batch_size), run.record(reference, batch_size)
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
    """One ratio per measuring process (the median of its round ratios): over the processes a
    pooled measurement kept, or the one run a measurement is."""
    runs = throughput.processes or [throughput]
    return [statistics.median(round_ratios(run, name, batch_size, reference)) for run in runs]


SINGULAR = {"processes": "process", "seeds": "seed"}


@dataclass(frozen=True)
class RatioEstimate:
    """The mean ratio over ``count`` replicates (``over``: "processes" or "seeds") with its 95%
    Student-t interval (None below two replicates)."""

    mean: float
    interval: tuple[float, float] | None
    count: int
    over: str

    def text(self) -> str:
        """``3.1x (95% t-interval [2.9, 3.3] over 3 processes)``."""
        if self.interval is None:
            return f"{self.mean:.3g}x (1 {SINGULAR[self.over]}, no interval)"
        low, high = self.interval
        return (
            f"{self.mean:.3g}x (95% t-interval [{low:.3g}, {high:.3g}] over {self.count} "
            f"{self.over})"
        )

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval (False without one)."""
        return self.interval is not None and self.interval[0] <= value <= self.interval[1]


def ratio_estimate(per_seed: Sequence[Sequence[float]]) -> RatioEstimate:
    """The estimate from each seed's process ratios: over the processes with one seed, over the
    seeds' means with several."""
    groups = [list(values) for values in per_seed if values]
    if not groups:
        raise ValueError("no ratios: give at least one process's ratio")
    if len(groups) == 1:
        values, over = groups[0], "processes"
    else:
        values, over = [statistics.fmean(group) for group in groups], "seeds"
    spread = seed_spread(values)
    interval = None if spread is None or spread.low is None else (spread.low, spread.high)
    return RatioEstimate(statistics.fmean(values), interval, len(values), over)
