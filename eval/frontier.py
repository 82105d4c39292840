"""The speed-quality frontier: judge perplexity against generation throughput, one point per
model family and sampler setting, the Pareto set, low-entropy marking and the headline sentence.

    points = [Point("ar", "ar T=1", 64, 12_000.0, 620.0, (560.0, 690.0), 3.85), ...]
    front = frontier(points, reference_entropy=3.83)
    front.front, front.front_unmarked, front.marked
    front_markdown(front); frontier_figure(front); headline({0: points}, batch_size=64)
    report_frontier(report, {0: points}, reference_entropy=3.83, throughput=measured)

Everything here is a pure function of the points; the throughput comes from
``eval.throughput.measure`` (one fair measurement: warm-up, alternating rounds, median) and the
judge perplexity and entropy from ``eval.quality``.

**Pareto rule.** Higher tokens/s and lower judge perplexity are better. A point is on the front
when no other point is at least as good on both axes and strictly better on one. Two equal points
(same tokens/s, same perplexity) do not dominate each other, so both are on the front. Dominance
uses the point estimates: a point dominated only within the noise of the perplexity intervals is
still dominated (the intervals are drawn, not used to rescue points).

**Entropy marking.** Judge perplexity rewards repetitive text (the judge predicts repeats well),
so a point whose mean per-sample unigram entropy falls more than ``ENTROPY_MARGIN`` (10%,
relative) below held-out text's, cut to the same length in the same tokenizer, is *marked
low-entropy*. The front is given with and without the marked points; the headline never picks
one. Why 10%: in the demo report (64-token samples, BPE 512) held-out text has 3.76 nats per
64-token sample (recomputed with the same kind of tokenizer), and the standard error of a set's
mean over 32 samples is 0.2-1% of it (3% for the noisiest set); tempered sampling (AR at T=0.7,
ancestral MDM at T=0.7) sits 2% below held-out text, while the low-confidence samplers, whose
text repeats "and the LORD", sit 12% (8 steps) to 25% (64 steps) below. 10% separates a
legitimate temperature from that degeneracy by several standard errors on both sides.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eval.budgets import seed_spread
from eval.report import Report
from eval.throughput import Throughput

ENTROPY_MARGIN = 0.10

# Fixed before any run, like the findings' RULES: the report quotes it above its sentence.
HEADLINE_RULE = {
    "id": "fastest-within-1.5x-of-ar",
    "ppl_ratio": 1.5,
    "ar_family": "ar",
    "ar_setting": "ar T=1",
    "text": (
        "**Rule (headline).** At batch B, among the settings of every family other than the AR, "
        "take those whose judge perplexity (point estimate, mean over seeds) is at most 1.5x the "
        "AR's at T=1 (its untempered samples) and that are not marked low-entropy; the headline "
        "names the fastest of them (median tokens/s of the fair measurement, mean over seeds; a "
        "tie in speed goes to the lower perplexity, and a tie in both names every tied setting) "
        "and its tokens/s against the AR's. With several seeds it gives the 95% Student-t "
        "interval of the per-seed ratio (setting tokens/s / AR tokens/s). No AR point at that "
        "batch: no headline. No setting passing: a sentence that says so."
    ),
}


@dataclass(frozen=True)
class Point:
    """One (family, setting) at one batch size: its measured speed and sample quality.

    ``judge_ppl_ci95``: the perplexity's 95% interval over samples (None when not measured).
    ``entropy``: mean per-sample unigram entropy of the samples' token ids, nats (None: unknown,
    then the point cannot be marked).
    """

    family: str
    setting: str
    batch_size: int
    tokens_per_s: float
    judge_ppl: float
    judge_ppl_ci95: tuple[float, float] | None = None
    entropy: float | None = None

    def __post_init__(self) -> None:
        for name in ("tokens_per_s", "judge_ppl"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{self.setting}: {name}={value!r} must be a finite number > 0")

    @property
    def key(self) -> tuple[str, str]:
        return self.family, self.setting


@dataclass
class Frontier:
    """Points at one batch size, which are marked, and the front with and without them."""

    points: list[Point]
    reference_entropy: float | None
    margin: float
    marked: list[Point] = field(default_factory=list)
    front: list[Point] = field(default_factory=list)
    front_unmarked: list[Point] = field(default_factory=list)

    def is_marked(self, point: Point) -> bool:
        return point in self.marked


def dominates(a: Point, b: Point) -> bool:
    """a is at least as fast and at least as good as b, and strictly better on one axis."""
    at_least = a.tokens_per_s >= b.tokens_per_s and a.judge_ppl <= b.judge_ppl
    strictly = a.tokens_per_s > b.tokens_per_s or a.judge_ppl < b.judge_ppl
    return at_least and strictly


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The points no other point dominates, fastest first (equal points are all kept)."""
    front = [p for p in points if not any(dominates(q, p) for q in points)]
    return sorted(front, key=lambda p: (-p.tokens_per_s, p.judge_ppl, p.family, p.setting))


def low_entropy(point: Point, reference_entropy: float | None, margin: float = ENTROPY_MARGIN):
    """True when the point's entropy is more than ``margin`` (relative) below the reference's.
    Unknown entropies (the point's or the reference's) mark nothing."""
    if point.entropy is None or reference_entropy is None:
        return False
    return point.entropy < (1.0 - margin) * reference_entropy


def frontier(
    points: Sequence[Point],
    reference_entropy: float | None,
    margin: float = ENTROPY_MARGIN,
) -> Frontier:
    """Mark the low-entropy points and compute the front with and without them. All points must
    share one batch size (speeds at different batches are different comparisons)."""
    if not points:
        raise ValueError("no points: the frontier needs at least one measured setting")
    batches = sorted({p.batch_size for p in points})
    if len(batches) > 1:
        raise ValueError(f"points at several batch sizes {batches}: draw one frontier per batch")
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise ValueError("each (family, setting) must appear once; average seeds first")
    if not 0 <= margin < 1:
        raise ValueError(f"margin={margin!r} must be in [0, 1) (a relative drop)")
    marked = [p for p in points if low_entropy(p, reference_entropy, margin)]
    unmarked = [p for p in points if p not in marked]
    return Frontier(
        points=list(points),
        reference_entropy=reference_entropy,
        margin=margin,
        marked=marked,
        front=pareto_front(points),
        front_unmarked=pareto_front(unmarked),
    )


def front_rows(front: Frontier, *, unmarked: bool = True) -> tuple[list[str], list[list]]:
    """(columns, rows) of the front (without marked points by default), fastest first."""
    columns = ["family", "setting", "tokens/s", "judge ppl [95%]", "entropy (nats)", "marked"]
    rows = []
    for p in front.front_unmarked if unmarked else front.front:
        interval = (
            f" [{p.judge_ppl_ci95[0]:.4g}, {p.judge_ppl_ci95[1]:.4g}]" if p.judge_ppl_ci95 else ""
        )
        rows.append(
            [
                p.family,
                p.setting,
                f"{p.tokens_per_s:,.0f}",
                f"{p.judge_ppl:.4g}{interval}",
                "-" if p.entropy is None else f"{p.entropy:.3f}",
                "low-entropy" if front.is_marked(p) else "",
            ]
        )
    return columns, rows


def front_markdown(front: Frontier) -> str:
    """The front with and without marked points as markdown tables, with the reference."""
    reference = (
        "unknown (nothing marked)"
        if front.reference_entropy is None
        else f"{front.reference_entropy:.3f} nats"
    )
    parts = [
        f"Batch {front.points[0].batch_size}; held-out text's entropy {reference}; a point is "
        f"marked low-entropy below {1 - front.margin:.0%} of it. "
        f"{len(front.marked)} of {len(front.points)} points marked.",
    ]
    for title, unmarked in (("Front without marked points", True), ("Front, all points", False)):
        columns, rows = front_rows(front, unmarked=unmarked)
        parts += ["", f"**{title}**", "", "| " + " | ".join(columns) + " |"]
        parts.append("| " + " | ".join("---" for _ in columns) + " |")
        parts += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(parts)


def frontier_figure(front: Frontier, title: str | None = None):
    """Judge perplexity against tokens/s (log x; log y when the perplexities span over 20x): one
    colour per family, marked points hollow, perplexity intervals as error bars, the front
    without marked points as a solid step line and the front of all points dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, family in enumerate(sorted({p.family for p in front.points})):
        draw_family(axis, front, family, colours[index % len(colours)])
    draw_fronts(axis, front)
    axis.set_xscale("log")
    values = [p.judge_ppl for p in front.points]
    if max(values) / min(values) > 20:
        axis.set_yscale("log")
    axis.set_xlabel("generated tokens/s (median of alternating rounds)")
    axis.set_ylabel("judge perplexity (lower is better)")
    axis.set_title(title or f"speed-quality frontier, batch {front.points[0].batch_size}")
    axis.legend(fontsize=7)
    return figure


def draw_family(axis, front: Frontier, family: str, colour: str) -> None:
    """One family's points with their perplexity intervals, marked points hollow."""
    for hollow in (False, True):
        group = [p for p in front.points if p.family == family and front.is_marked(p) == hollow]
        if not group:
            continue
        low = [p.judge_ppl - (p.judge_ppl_ci95 or (p.judge_ppl,))[0] for p in group]
        high = [(p.judge_ppl_ci95 or (0, p.judge_ppl))[1] - p.judge_ppl for p in group]
        axis.errorbar(
            [p.tokens_per_s for p in group],
            [p.judge_ppl for p in group],
            yerr=[low, high],
            fmt="o",
            color=colour,
            markerfacecolor="none" if hollow else colour,
            label=family + (" (low-entropy)" if hollow else ""),
            capsize=2,
        )


def draw_fronts(axis, front: Frontier) -> None:
    """Both fronts as staircases (between two front points the best perplexity reachable at
    that speed or faster is the faster point's, hence where="pre"), the unmarked one labelled."""
    for line, style, width, label in (
        (front.front, "--", 1.0, "front incl. low-entropy"),
        (front.front_unmarked, "-", 1.5, "front"),
    ):
        if line:
            ordered = sorted(line, key=lambda p: p.tokens_per_s)
            axis.step(
                [p.tokens_per_s for p in ordered],
                [p.judge_ppl for p in ordered],
                where="pre",
                linestyle=style,
                color="black",
                linewidth=width,
                label=label,
            )
    for p in front.front_unmarked:
        axis.annotate(
            p.setting, (p.tokens_per_s, p.judge_ppl), fontsize=6, xytext=(3, 3),
            textcoords="offset points",
        )  # fmt: skip


def points_from_stages(
    sets: Mapping[str, Mapping],
    scores: Mapping[str, Mapping],
    throughput: Throughput,
    batch_size: int,
    exclude: Sequence[str] = ("unigram",),
) -> list[Point]:
    """Points at ``batch_size`` from the compare job's stages: ``sets`` (name -> generation
    entry with its "objective"), ``scores`` (name -> quality row with "judge_ppl",
    "judge_ppl_ci95", "unigram_entropy") and the fair ``throughput`` measurement of the same
    names. Families in ``exclude`` (the unigram floor: no network, no speed to compare) and
    settings without a record at that batch are left out."""
    points = []
    for name, entry in sets.items():
        if entry["objective"] in exclude or name not in scores:
            continue
        try:
            speed = throughput.record(name, batch_size).tokens_per_s.median
        except KeyError:
            continue
        row = scores[name]
        interval = row.get("judge_ppl_ci95")
        points.append(
            Point(
                family=entry["objective"],
                setting=name,
                batch_size=batch_size,
                tokens_per_s=speed,
                judge_ppl=row["judge_ppl"],
                judge_ppl_ci95=tuple(interval) if interval else None,
                entropy=row.get("unigram_entropy"),
            )
        )
    return points


# ---- the headline ------------------------------------------------------------------------------


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% Student-t interval of the mean (``eval.budgets.seed_spread``); None below two
    values."""
    spread = seed_spread(list(values))
    return None if spread is None or spread.low is None else (spread.low, spread.high)


def seed_means(runs: Mapping[int, Sequence[Point]], batch_size: int) -> list[Point]:
    """One point per (family, setting) at ``batch_size``: tokens/s, perplexity and entropy
    averaged over the seeds that measured it (the perplexity interval kept only for one seed)."""
    grouped: dict[tuple[str, str], list[Point]] = {}
    for points in runs.values():
        for p in points:
            if p.batch_size == batch_size:
                grouped.setdefault(p.key, []).append(p)
    means = []
    for (family, setting), group in grouped.items():
        entropies = [p.entropy for p in group]
        means.append(
            Point(
                family=family,
                setting=setting,
                batch_size=batch_size,
                tokens_per_s=statistics.fmean(p.tokens_per_s for p in group),
                judge_ppl=statistics.fmean(p.judge_ppl for p in group),
                judge_ppl_ci95=group[0].judge_ppl_ci95 if len(group) == 1 else None,
                entropy=None if None in entropies else statistics.fmean(entropies),
            )
        )
    return means


def headline(
    runs: Mapping[int, Sequence[Point]],
    batch_size: int,
    reference_entropy: float | None,
    rule: Mapping = HEADLINE_RULE,
) -> str:
    """The headline sentence of ``rule`` for ``runs`` (seed -> points at every batch size),
    generated from the data. Raises ValueError when the AR reference point is missing."""
    points = seed_means(runs, batch_size)
    ar_key = (rule["ar_family"], rule["ar_setting"])
    ar = next((p for p in points if p.key == ar_key), None)
    if ar is None:
        raise ValueError(
            f"no headline at batch {batch_size}: the rule compares against the AR's "
            f"{rule['ar_setting']!r}, which was not measured at that batch"
        )
    limit = rule["ppl_ratio"] * ar.judge_ppl
    candidates = [p for p in points if p.family != rule["ar_family"]]
    within = [p for p in candidates if p.judge_ppl <= limit]
    passing = [p for p in within if not low_entropy(p, reference_entropy)]
    lead = (
        f"At batch {batch_size}, the AR ({rule['ar_setting']}) gives {ar.tokens_per_s:,.0f} "
        f"tokens/s at judge perplexity {ar.judge_ppl:.4g}"
    )
    if not passing:
        if not candidates:
            why = "there is no setting of another family to compare"
        elif not within:
            best = min(candidates, key=lambda p: p.judge_ppl)
            why = (
                f"no setting is within {rule['ppl_ratio']:g}x of its judge perplexity (the "
                f"closest, {best.setting}, has {best.judge_ppl:.4g}, "
                f"{best.judge_ppl / ar.judge_ppl:.2f}x)"
            )
        else:
            why = (
                f"all {len(within)} settings within {rule['ppl_ratio']:g}x of its judge "
                f"perplexity are marked low-entropy ({', '.join(p.setting for p in within)})"
            )
        return f"{lead}; no setting qualifies: {why}."
    fastest = max(p.tokens_per_s for p in passing)
    top = [p for p in passing if p.tokens_per_s == fastest]
    best_ppl = min(p.judge_ppl for p in top)
    winners = sorted((p for p in top if p.judge_ppl == best_ppl), key=lambda p: p.setting)
    names = " and ".join(p.setting for p in winners)
    verb = "are" if len(winners) > 1 else "is"
    sentence = (
        f"At batch {batch_size}, the fastest setting within {rule['ppl_ratio']:g}x of the AR's "
        f"judge perplexity (and not low-entropy) {verb} {names}, at {fastest:,.0f} tokens/s "
        f"(judge perplexity {best_ppl:.4g}) against the AR's {ar.tokens_per_s:,.0f} "
        f"(judge perplexity {ar.judge_ppl:.4g}): {fastest / ar.tokens_per_s:.3g}x"
    )
    ratios = per_seed_ratios(runs, batch_size, winners[0].key, ar_key)
    interval = t_interval(ratios)
    if interval is None:
        return sentence + f" ({len(ratios)} seed, no interval over seeds)."
    return sentence + (
        f" (per-seed ratio {statistics.fmean(ratios):.3g}x, 95% t-interval "
        f"[{interval[0]:.3g}, {interval[1]:.3g}] over {len(ratios)} seeds)."
    )


def per_seed_ratios(
    runs: Mapping[int, Sequence[Point]],
    batch_size: int,
    key: tuple[str, str],
    ar_key: tuple[str, str],
) -> list[float]:
    """tokens/s of ``key`` over the AR's, for every seed that measured both at ``batch_size``."""
    ratios = []
    for seed in sorted(runs):
        at = {p.key: p for p in runs[seed] if p.batch_size == batch_size}
        if key in at and ar_key in at:
            ratios.append(at[key].tokens_per_s / at[ar_key].tokens_per_s)
    return ratios


# ---- into a report -----------------------------------------------------------------------------


def report_frontier(
    report: Report,
    runs: Mapping[int, Sequence[Point]],
    reference_entropy: float | None,
    throughput: Throughput | None = None,
) -> dict[str, Any]:
    """Add the frontier section to ``report``: the measurement table (when given), then per
    batch size the headline rule and its sentence, the front with and without marked points and
    the figure. The frontier uses the mean over seeds; returns what goes into report.json."""
    results: dict[str, Any] = {"rule": dict(HEADLINE_RULE), "margin": ENTROPY_MARGIN}
    report.text("## Speed-quality frontier")
    if throughput is not None:
        report.text(throughput.markdown())
        results["throughput"] = throughput.as_dict()
    report.text(HEADLINE_RULE["text"])
    batches = sorted({p.batch_size for points in runs.values() for p in points})
    for batch in batches:
        front = frontier(seed_means(runs, batch), reference_entropy)
        try:
            sentence = headline(runs, batch, reference_entropy)
        except ValueError as error:
            sentence = f"No headline: {error}."
        report.text(f"**Batch {batch}.** {sentence}")
        report.text(front_markdown(front))
        report.plot(
            f"frontier_batch{batch}",
            frontier_figure(front),
            f"Judge perplexity against generated tokens/s at batch {batch}; hollow: low-entropy",
        )
        results[f"batch {batch}"] = {
            "headline": sentence,
            "points": [asdict(p) for p in front.points],
            "marked": [p.setting for p in front.marked],
            "front": [p.setting for p in front.front],
            "front_unmarked": [p.setting for p in front.front_unmarked],
        }
    report.results["frontier"] = results
    return results
