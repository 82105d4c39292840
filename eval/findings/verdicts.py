"""Verdict rules: a finding is *reproduced* only when 95% intervals say so, never on point
estimates, and only when its models learned. Every finding's report quotes the rules it applies
(``RULES``) before its numbers.

The intervals cover training randomness: a quantity measured once per seed gets the Student-t
interval of its mean over seeds (``seed_interval``; one seed gives an unbounded interval, so no
verdict rests on one training run), a paired MDM-AR difference the t interval of the per-seed
differences (``paired_difference``), and an accuracy the union of that t interval and the Wilson
interval of every (seed, example) trial pooled (``accuracy_interval``: seeds that agree perfectly
still leave the finite number of examples; one seed leaves the whole of [0, 1]).

A rule cannot be won by a wide interval: the direction rule needs the intervals separated, the
magnitude rule needs the whole interval inside a band declared with the finding (``Band``), and
``learned_gate`` turns any verdict into *inconclusive (not trained)* when a model failed the
check the finding states for it; ``one_seed_guard`` turns a verdict from one training seed into
*inconclusive*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from scipy import stats

Z95 = 1.959964
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_TRAINED = "inconclusive (not trained)"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TRAINED)

RULES = {
    "direction": (
        "**Rule (direction).** The claim says quantity A is below quantity B. *Reproduced*: A's "
        "95% interval lies entirely below B's. *Not reproduced*: A's interval lies entirely above "
        "B's (the opposite direction, separated). *Inconclusive*: the intervals overlap, either "
        "interval is unbounded on a side, or a quantity was not measured."
    ),
    "magnitude": (
        "**Rule (magnitude).** The finding declares, before any run, an equivalence band around "
        "the published value (the values it counts as the same result). *Reproduced*: our whole "
        "95% interval lies inside the band (an interval unbounded on either side never does). "
        "*Not reproduced*: our interval and the band are disjoint. *Inconclusive*: they overlap "
        "without the interval lying inside, or nothing was measured. A wider interval can only "
        "move a verdict towards *inconclusive*."
    ),
    "learned": (
        "**Gate (learned).** Each model must pass the check stated for it below (a learning curve "
        "past its plateau, or a positive control's accuracy); otherwise the verdict is "
        "*inconclusive (not trained)* whatever the comparison says, and the report names the "
        "model, the check and its measured value."
    ),
    "seeds": (
        "**Intervals.** 95% Student-t intervals over training seeds (n - 1 degrees of freedom), "
        "paired MDM-AR differences where both ran on the same seed; accuracies take the union of "
        "that interval and the Wilson interval of all (seed, example) trials pooled. One training "
        "seed gives no verdict: *inconclusive*, whatever its numbers."
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


def seed_interval(values: Sequence[float]) -> Interval:
    """The 95% Student-t interval of the mean over training seeds of a quantity measured once
    per seed. One seed says nothing about training randomness: its interval is unbounded."""
    if not values:
        raise ValueError("seed_interval needs at least one value")
    if len(values) == 1:
        return Interval(values[0], -math.inf, math.inf)
    return t_interval(values)


def paired_difference(first: Sequence[float], second: Sequence[float]) -> Interval:
    """The seed interval of ``first[i] - second[i]``: both measured on seed i, so what the seeds
    share (data order, initialisation draw) cancels."""
    if len(first) != len(second) or not first:
        raise ValueError(f"need equal, non-empty per-seed lists: {len(first)} vs {len(second)}")
    return seed_interval([a - b for a, b in zip(first, second)])


def accuracy_interval(fractions: Sequence[float], trials: Sequence[int]) -> Interval:
    """An accuracy measured on ``trials[i]`` examples in seed i: the pooled value with the union
    of the seeds' t interval (training randomness; clipped to [0, 1]) and the pooled Wilson
    interval (the finite examples). One seed's t interval is unbounded, so its union is all of
    [0, 1]: the examples of one training run say nothing about training randomness."""
    pooled = pooled_accuracy(fractions, trials)
    if len(fractions) < 2:
        return Interval(pooled.value, 0.0, 1.0)
    seeds = t_interval(fractions)
    return Interval(
        pooled.value,
        min(pooled.low, max(0.0, seeds.low)),
        max(pooled.high, min(1.0, seeds.high)),
    )


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
    """The claim "``lower`` < ``higher``" judged by the direction rule. An interval unbounded
    on either side (one seed, or a ratio's open end) never separates: inconclusive."""
    if lower is None or higher is None or not (bounded(lower) and bounded(higher)):
        return INCONCLUSIVE
    if lower.high < higher.low:
        return REPRODUCED
    if lower.low > higher.high:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def bounded(interval: Interval) -> bool:
    return math.isfinite(interval.low) and math.isfinite(interval.high)


@dataclass(frozen=True)
class Band:
    """The values a finding counts as its published value, declared with the finding."""

    published: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low <= self.published <= self.high or math.isinf(self.high - self.low):
            raise ValueError(
                f"a band is finite and holds the published value: [{self.low}, {self.high}] "
                f"around {self.published}"
            )

    def text(self) -> str:
        return f"{self.published:g} (band [{self.low:g}, {self.high:g}])"


def magnitude_verdict(band: Band, measured: Interval | None) -> str:
    """The claim "the value is ``band.published``" judged by the magnitude rule."""
    if measured is None:
        return INCONCLUSIVE
    if band.low <= measured.low and measured.high <= band.high:
        return REPRODUCED  # an infinite end never lies inside a finite band
    if measured.high < band.low or measured.low > band.high:
        return NOT_REPRODUCED
    return INCONCLUSIVE


@dataclass(frozen=True)
class LearnedCheck:
    """Whether one model learned what a finding needs it to have learned: ``model`` passed
    ``check`` (e.g. "validation loss 0.1 nats below the unigram entropy") with ``measured``."""

    model: str
    check: str
    measured: str
    passed: bool

    def text(self) -> str:
        return f"{self.model}: {self.check}: {self.measured} ({'pass' if self.passed else 'FAIL'})"


def learned_gate(
    verdict: str, checks: Sequence[LearnedCheck], larger_budget: str
) -> tuple[str, list[str]]:
    """The verdict after the learned gate: *inconclusive (not trained)* when any check failed,
    with one note per failed check and ``larger_budget`` (what the gpu scale gives); otherwise
    the verdict unchanged. Every finding states at least one check per model."""
    if not checks:
        raise ValueError("a finding must state its learned checks")
    failed = [check for check in checks if not check.passed]
    if not failed:
        return verdict, []
    notes = [
        f"Not trained: {check.model} failed the check '{check.check}' (measured "
        f"{check.measured}); the comparison's own verdict would have been *{verdict}*."
        for check in failed
    ]
    return NOT_TRAINED, notes + [f"The `gpu` scale gives {larger_budget}."]


def pooled_accuracy(fractions: Sequence[float], trials: Sequence[int]) -> Interval:
    """The Wilson interval of an accuracy pooled over groups (seeds, settings) that each scored
    ``fractions[i]`` of ``trials[i]`` examples."""
    hits = sum(round(f * n) for f, n in zip(fractions, trials, strict=True))
    return wilson_interval(hits, sum(trials))


def combine(verdicts: Sequence[str]) -> str:
    """A claim made of parts: reproduced when every part is, not reproduced when any part is
    (its direction reversed, separated), inconclusive otherwise. A claim of no parts has
    nothing measured: refused, never reproduced."""
    if not verdicts:
        raise ValueError("combine needs at least one part's verdict")
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return NOT_REPRODUCED if NOT_REPRODUCED in verdicts else INCONCLUSIVE


def one_seed_guard(verdict: str, seeds: int) -> tuple[str, list[str]]:
    """No verdict rests on one training run: with fewer than two seeds the comparison's verdict
    becomes inconclusive (*not trained* stays), with the note that says why."""
    if seeds >= 2:
        return verdict, []
    note = (
        f"One training seed: its intervals say nothing about training randomness, so the "
        f"comparison's *{verdict}* counts as *{INCONCLUSIVE}*. Run at least two seeds."
    )
    return (verdict if verdict == NOT_TRAINED else INCONCLUSIVE), [note]


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
