"""Verdict rules: a finding is *reproduced* only when 95% intervals say so, never on point
estimates. Every finding's report quotes the rule it applies (``RULES``) before its numbers.

Intervals come from two places: accuracies pooled over every (seed, example) trial (Wilson) and
means over seeds that also carry a within-seed standard error (``seed_interval``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from scipy import stats

Z95 = 1.959964
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

RULES = {
    "direction": (
        "**Rule (direction).** The claim says quantity A is below quantity B. *Reproduced*: A's "
        "95% interval lies entirely below B's. *Not reproduced*: A's interval lies entirely above "
        "B's (the opposite direction, separated). *Inconclusive*: the intervals overlap, or a "
        "quantity was not measured."
    ),
    "magnitude": (
        "**Rule (magnitude).** *Reproduced*: the published value lies inside our 95% interval. "
        "*Not reproduced*: our interval is bounded and excludes it. *Inconclusive*: no interval "
        "(not measured, or unbounded on the side of the published value)."
    ),
}


@dataclass(frozen=True)
class Interval:
    """A measured value with its 95% interval; ``low``/``high`` may be infinite (unbounded)."""

    value: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low <= self.value <= self.high:
            raise ValueError(f"interval [{self.low}, {self.high}] must contain {self.value}")

    def text(self, digits: int = 3) -> str:
        def show(x: float) -> str:
            return "unbounded" if math.isinf(x) else f"{x:.{digits}g}"

        return f"{show(self.value)} [{show(self.low)}, {show(self.high)}]"

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def wilson_interval(successes: int, trials: int) -> Interval:
    """The 95% Wilson score interval of a binomial proportion (sensible at 0 and 1)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes={successes} <= trials={trials}, trials >= 1")
    p = successes / trials
    denominator = 1 + Z95**2 / trials
    centre = (p + Z95**2 / (2 * trials)) / denominator
    half = Z95 * math.sqrt(p * (1 - p) / trials + Z95**2 / (4 * trials**2)) / denominator
    return Interval(p, max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))


def seed_interval(values: Sequence[float], stderrs: Sequence[float] | None = None) -> Interval:
    """The 95% interval of the mean over seeds of a quantity each seed measured with its own
    standard error: the variance of the mean is (mean within-seed variance + the between-seed
    sample variance) / n, under a normal approximation (stated in the reports: with 2-3 seeds the
    between-seed variance is itself uncertain)."""
    if not values:
        raise ValueError("seed_interval needs at least one value")
    n = len(values)
    mean = sum(values) / n
    within = 0.0 if stderrs is None else sum(se**2 for se in stderrs) / n
    between = 0.0 if n == 1 else sum((v - mean) ** 2 for v in values) / (n - 1)
    half = Z95 * math.sqrt((within + between) / n)
    return Interval(mean, mean - half, mean + half)


def t_interval(values: Sequence[float]) -> Interval:
    """The 95% Student-t interval of the mean of ``values`` (n >= 2)."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a t interval needs >= 2 values, got {n}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


def direction_verdict(lower: Interval | None, higher: Interval | None) -> str:
    """The claim "``lower`` < ``higher``" judged by the direction rule."""
    if lower is None or higher is None:
        return INCONCLUSIVE
    if lower.high < higher.low:
        return REPRODUCED
    if lower.low > higher.high:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def magnitude_verdict(published: float, measured: Interval | None) -> str:
    """The claim "the value is ``published``" judged by the magnitude rule."""
    if measured is None:
        return INCONCLUSIVE
    if measured.low <= published <= measured.high:
        return REPRODUCED
    if (published < measured.low and not math.isinf(measured.low)) or (
        published > measured.high and not math.isinf(measured.high)
    ):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def pooled_accuracy(fractions: Sequence[float], trials: Sequence[int]) -> Interval:
    """The Wilson interval of an accuracy pooled over groups (seeds, settings) that each scored
    ``fractions[i]`` of ``trials[i]`` examples."""
    hits = sum(round(f * n) for f, n in zip(fractions, trials, strict=True))
    return wilson_interval(hits, sum(trials))


def combine(verdicts: Sequence[str]) -> str:
    """A claim made of parts: reproduced when every part is, not reproduced when any part is
    (its direction reversed, separated), inconclusive otherwise."""
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return NOT_REPRODUCED if NOT_REPRODUCED in verdicts else INCONCLUSIVE


def direction_in_every_seed(
    lower: Interval, higher: Interval, lower_seeds: Sequence[float], higher_seeds: Sequence[float]
) -> tuple[str, bool, list[str]]:
    """The direction verdict of "lower < higher" over seeds pooled, where "reproduced" also needs
    the direction in every seed: (verdict, whether every seed agrees, the note to report)."""
    verdict = direction_verdict(lower, higher)
    agree = all_seeds_agree(lower_seeds, higher_seeds)
    if verdict == REPRODUCED and not agree:
        return (
            INCONCLUSIVE,
            agree,
            ["The intervals separate but not every seed agrees: inconclusive."],
        )
    return verdict, agree, []


def all_seeds_agree(lower: Sequence[float], higher: Sequence[float]) -> bool:
    """Whether ``lower[i] < higher[i]`` for every seed i (a finding's per-seed sanity check)."""
    if len(lower) != len(higher) or not lower:
        raise ValueError(f"need equal, non-empty per-seed lists: {len(lower)} vs {len(higher)}")
    return all(a < b for a, b in zip(lower, higher))
