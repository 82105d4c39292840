"""The speed-quality frontier: judge perplexity against generation throughput, one point per
model family and sampler setting, the Pareto set, low-entropy marking and the headline sentence.

    points = [Point("ar", "ar T=1", 64, 12_000.0, 620.0, (560.0, 690.0), 3.85), ...]
    front = frontier(points)
    front.front, front.front_unmarked, front.marked
    front_markdown(front); frontier_figure(front)

The headline its fixed rule generates, the mean over seeds and the report section are in
``eval.speed.frontier_headline``.

Everything here is a pure function of the points; the throughput comes from
``eval.speed.throughput.measure`` (one fair measurement: warm-up, alternating rounds, median) and
the judge perplexity and entropy from ``eval.quality``.

**Pareto rule.** Higher tokens/s and lower judge perplexity are better. A point is on the front
when no other point is at least as good on both axes and strictly better on one. Two equal points
(same tokens/s, same perplexity) do not dominate each other, so both are on the front. Dominance
uses the point estimates: a point dominated only within the noise of the perplexity intervals is
still dominated (the intervals are drawn, not used to rescue points).

**Marks.** Judge perplexity rewards repetitive text (the judge predicts repeats well), so
every point is checked against held-out text cut to the same lengths as its samples
(``eval.sample_sets.HeldOutText.bounds``). It is marked *low-entropy* when its mean per-sample
unigram entropy is below the floor held-out text sets, *repetitive* when its mean 4-gram
repetition rate is above held-out text's ceiling, and *unknown* when either quantity or its bound
was not measured. Floor and ceiling are held-out text's own mean over windows of the samples'
lengths, minus (plus) 1.96 standard errors of a set of the report's largest size: a set of that
many samples of held-out text passes 97.5% of the time, no set's bound is widened by drawing
fewer samples, and the bound comes from held-out text alone, never from the samplers judged.
The front is given with and without the marked points; the headline never picks a marked (or
unknown) one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eval.speed.ratios import RatioEstimate, process_ratios, ratio_estimate
from eval.speed.throughput import Throughput

UNKNOWN, LOW_ENTROPY, REPETITIVE = "unknown", "low-entropy", "repetitive"


@dataclass(frozen=True)
class Point:
    """One (family, setting) at one batch size: its measured speed and sample quality.

    ``judge_ppl_ci95``: the perplexity's 95% interval over samples (None when not measured).
    ``entropy``: mean per-sample unigram entropy of the samples' token ids, nats;
    ``entropy_floor``: the lowest such mean held-out text of the same lengths passes.
    ``repetition``: mean per-sample 4-gram repetition rate; ``repetition_ceiling``: the highest
    held-out text passes. None: not measured, and the point is marked unknown.
    ``speed_ratios``: per seed, the tokens/s over the AR's at T=1 in the same rounds of each
    measuring process (``eval.speed.ratios``); empty when the AR was not measured with it.
    """

    family: str
    setting: str
    batch_size: int
    tokens_per_s: float
    judge_ppl: float
    judge_ppl_ci95: tuple[float, float] | None = None
    entropy: float | None = None
    entropy_floor: float | None = None
    repetition: float | None = None
    repetition_ceiling: float | None = None
    tpf: float | None = None  # valid tokens per network evaluation (the leaderboard's TPF)
    nfe: float | None = None  # network evaluations per sample
    speed_ratios: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        for name in ("tokens_per_s", "judge_ppl"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{self.setting}: {name}={value!r} must be a finite number > 0")

    @property
    def key(self) -> tuple[str, str]:
        return self.family, self.setting

    @property
    def speed_ratio(self) -> RatioEstimate | None:
        """Its tokens/s over the AR's, mean with the 95% interval over processes (seeds)."""
        return ratio_estimate(self.speed_ratios) if self.speed_ratios else None


@dataclass
class Frontier:
    """Points at one batch size, their marks, and the front with and without marked points."""

    points: list[Point]
    marks: dict[tuple[str, str], str] = field(default_factory=dict)
    front: list[Point] = field(default_factory=list)
    front_unmarked: list[Point] = field(default_factory=list)

    @property
    def marked(self) -> list[Point]:
        return [p for p in self.points if self.marks.get(p.key)]

    def is_marked(self, point: Point) -> bool:
        return bool(self.marks.get(point.key))


def dominates(a: Point, b: Point) -> bool:
    """a is at least as fast and at least as good as b, and strictly better on one axis."""
    at_least = a.tokens_per_s >= b.tokens_per_s and a.judge_ppl <= b.judge_ppl
    strictly = a.tokens_per_s > b.tokens_per_s or a.judge_ppl < b.judge_ppl
    return at_least and strictly


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The points no other point dominates, fastest first (equal points are all kept)."""
    front = [p for p in points if not any(dominates(q, p) for q in points)]
    return sorted(front, key=lambda p: (-p.tokens_per_s, p.judge_ppl, p.family, p.setting))


def mark(point: Point) -> str:
    """The point's mark against held-out text of the same lengths: "low-entropy" below the
    entropy floor, "repetitive" above the repetition ceiling, "unknown" when a quantity or its
    bound is missing, "" when it passes both."""
    if point.entropy is None or point.entropy_floor is None:
        return UNKNOWN
    if point.entropy < point.entropy_floor:
        return LOW_ENTROPY
    if point.repetition is None or point.repetition_ceiling is None:
        return UNKNOWN
    if point.repetition > point.repetition_ceiling:
        return REPETITIVE
    return ""


def frontier(points: Sequence[Point]) -> Frontier:
    """Mark the points and compute the front with and without the marked ones. All points must
    share one batch size (speeds at different batches are different comparisons)."""
    if not points:
        raise ValueError("no points: the frontier needs at least one measured setting")
    batches = sorted({p.batch_size for p in points})
    if len(batches) > 1:
        raise ValueError(f"points at several batch sizes {batches}: draw one frontier per batch")
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise ValueError("each (family, setting) must appear once; average seeds first")
    marks = {p.key: mark(p) for p in points}
    unmarked = [p for p in points if not marks[p.key]]
    return Frontier(
        points=list(points),
        marks=marks,
        front=pareto_front(points),
        front_unmarked=pareto_front(unmarked),
    )


def front_rows(front: Frontier, *, unmarked: bool = True) -> tuple[list[str], list[list]]:
    """(columns, rows) of the front (without marked points by default), fastest first."""
    columns = [
        "family",
        "setting",
        "tokens/s",
        "x AR [95%]",
        "TPF",
        "NFE",
        "judge ppl [95%]",
        "entropy (floor)",
        "mark",
    ]
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
                ratio_cell(p),
                "-" if p.tpf is None else f"{p.tpf:.3g}",
                "-" if p.nfe is None else f"{p.nfe:.4g}",
                f"{p.judge_ppl:.4g}{interval}",
                entropy_cell(p),
                front.marks.get(p.key, ""),
            ]
        )
    return columns, rows


def ratio_cell(point: Point) -> str:
    """The speed ratio to the AR with its interval, "-" when not measured."""
    estimate = point.speed_ratio
    if estimate is None:
        return "-"
    if estimate.interval is None:
        return f"{estimate.mean:.3g}"
    return f"{estimate.mean:.3g} [{estimate.interval[0]:.3g}, {estimate.interval[1]:.3g}]"


def entropy_cell(point: Point) -> str:
    entropy = "-" if point.entropy is None else f"{point.entropy:.3f}"
    floor = "-" if point.entropy_floor is None else f"{point.entropy_floor:.3f}"
    return f"{entropy} ({floor})"


def front_markdown(front: Frontier) -> str:
    """The front with and without marked points as markdown tables, with what the marks mean."""
    counts = {
        name: sum(1 for value in front.marks.values() if value == name)
        for name in (LOW_ENTROPY, REPETITIVE, UNKNOWN)
    }
    parts = [
        f"Batch {front.points[0].batch_size}. A point is marked low-entropy below the entropy "
        "floor of held-out text of its samples' lengths (in brackets), repetitive above its "
        "4-gram repetition ceiling, unknown when either was not measured. "
        f"{len(front.marked)} of {len(front.points)} points marked ("
        + ", ".join(f"{count} {name}" for name, count in counts.items())
        + ").",
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
            label=family + (" (marked)" if hollow else ""),
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
    "judge_ppl_ci95", "unigram_entropy", "repetition_rate_4gram" and their held-out bounds
    "entropy_floor", "repetition_ceiling") and the fair ``throughput`` measurement of the same
    names, with each process's ratio to the AR (``eval.speed.ratios``); TPF and NFE per sample
    from the generation entry. Families in ``exclude`` (the
    unigram floor: no network, no speed to compare) and settings without a record at that batch
    are left out."""
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
                entropy_floor=row.get("entropy_floor"),
                repetition=row.get("repetition_rate_4gram"),
                repetition_ceiling=row.get("repetition_ceiling"),
                tpf=entry.get("tpf"),
                nfe=entry.get("nfe_per_sample"),
                speed_ratios=ratios_of(throughput, name, batch_size),
            )
        )
    return points


def ratios_of(throughput: Throughput, name: str, batch_size: int) -> tuple[tuple[float, ...], ...]:
    """One seed's process ratios of ``name`` to the AR, () when the AR was not measured."""
    try:
        return (tuple(process_ratios(throughput, name, batch_size)),)
    except KeyError:
        return ()
