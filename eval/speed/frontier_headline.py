"""The speed-quality frontier's headline and report section: the points averaged over seeds,
the sentence its fixed rule generates (with the interval of the per-seed ratio and the ties in
quality), and the section a report gets (``report_frontier``).

    headline({0: points, 1: points}, batch_size=64)
    report_frontier(report, {0: points}, throughput=measured)
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from eval.budgets import seed_spread
from eval.report import Report
from eval.speed.frontier import Point, front_markdown, frontier, frontier_figure, mark
from eval.speed.throughput import Throughput

# Fixed before any run, like the findings' RULES: the report quotes it above its sentence.
HEADLINE_RULE = {
    "id": "fastest-within-1.5x-of-ar/v3",
    "ppl_ratio": 1.5,
    "ar_family": "ar",
    "ar_setting": "ar T=1",
    "text": (
        "**Rule (headline).** At batch B, among the settings of every family other than the AR, "
        "take those whose judge perplexity (point estimate, mean over seeds) is at most 1.5x the "
        "AR's at T=1 (its untempered samples) and that carry no mark (low-entropy, repetitive or "
        "unknown, against held-out text of the same lengths); the headline names the fastest of "
        "them by its speed ratio: its tokens/s over the AR's at T=1 in the same alternating "
        "rounds, the median over a process's rounds, then the geometric mean over the fresh "
        "measuring processes (and over seeds); a tie in speed goes to the lower perplexity, and a "
        "tie in both names every tied setting. It states that ratio with the 95% Student-t "
        "interval of its log ratios over the processes (over the seeds' means with several "
        "seeds), mapped back. No AR point at that batch: no "
        "headline. No setting passing: a sentence that says so. Settings passing whose "
        "perplexity interval overlaps the named one's are listed as ties in quality. (v2: ranked "
        "by the ratio measured in the same rounds, replicated over processes, instead of the "
        "median tokens/s of one pooled measurement; set before the reruns of "
        "docs/studies/frontier-reruns. v3: the mean and its interval taken on log ratios, as for "
        "the budget multiplier M, instead of on the ratios; set after those reruns.)"
    ),
}


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% Student-t interval of the mean (``eval.budgets.seed_spread``); None below two
    values."""
    spread = seed_spread(list(values))
    return None if spread is None or spread.low is None else (spread.low, spread.high)


def seed_means(runs: Mapping[int, Sequence[Point]], batch_size: int) -> list[Point]:
    """One point per (family, setting) at ``batch_size``: tokens/s, perplexity, entropy,
    repetition and their bounds averaged over the seeds that measured it (a quantity unknown in
    one seed is unknown); the perplexity interval is the span of the seeds' intervals."""
    grouped: dict[tuple[str, str], list[Point]] = {}
    for points in runs.values():
        for p in points:
            if p.batch_size == batch_size:
                grouped.setdefault(p.key, []).append(p)
    return [
        Point(
            family=family,
            setting=setting,
            batch_size=batch_size,
            tokens_per_s=statistics.fmean(p.tokens_per_s for p in group),
            judge_ppl=statistics.fmean(p.judge_ppl for p in group),
            judge_ppl_ci95=interval_span([p.judge_ppl_ci95 for p in group]),
            entropy=mean_or_none([p.entropy for p in group]),
            entropy_floor=mean_or_none([p.entropy_floor for p in group]),
            repetition=mean_or_none([p.repetition for p in group]),
            repetition_ceiling=mean_or_none([p.repetition_ceiling for p in group]),
            tpf=mean_or_none([p.tpf for p in group]),
            nfe=mean_or_none([p.nfe for p in group]),
            speed_ratios=seed_ratios(group),
        )
        for (family, setting), group in grouped.items()
    ]


def seed_ratios(group: Sequence[Point]) -> tuple[tuple[float, ...], ...]:
    """Every seed's process ratios, () when a seed has none (not measured against the AR)."""
    if any(not p.speed_ratios for p in group):
        return ()
    return tuple(ratios for p in group for ratios in p.speed_ratios)


def mean_or_none(values: Sequence[float | None]) -> float | None:
    return None if None in values else statistics.fmean(values)


def interval_span(intervals: Sequence[tuple[float, float] | None]) -> tuple[float, float] | None:
    """The smallest interval holding every seed's (None when a seed has none)."""
    if None in intervals:
        return None
    return min(low for low, _ in intervals), max(high for _, high in intervals)


def overlaps(a: Point, b: Point) -> bool:
    """Whether two points' perplexity intervals overlap (a point without one overlaps none)."""
    if a.judge_ppl_ci95 is None or b.judge_ppl_ci95 is None:
        return False
    return a.judge_ppl_ci95[0] <= b.judge_ppl_ci95[1] and b.judge_ppl_ci95[0] <= a.judge_ppl_ci95[1]


def headline(
    runs: Mapping[int, Sequence[Point]], batch_size: int, rule: Mapping = HEADLINE_RULE
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
    passing = passing_settings(points, rule)
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
                "perplexity are marked ("
                + ", ".join(f"{p.setting}: {mark(p)}" for p in within)
                + ")"
            )
        return f"{lead}; no setting qualifies: {why}."
    winners = fastest_passing(passing)
    named = winners[0]
    names = " and ".join(p.setting for p in winners)
    verb = "are" if len(winners) > 1 else "is"
    sentence = (
        f"At batch {batch_size}, the fastest setting within {rule['ppl_ratio']:g}x of the AR's "
        f"judge perplexity (and unmarked) {verb} {names}, at {named.tokens_per_s:,.0f} tokens/s "
        f"(judge perplexity {named.judge_ppl:.4g}) against the AR's {ar.tokens_per_s:,.0f} "
        f"(judge perplexity {ar.judge_ppl:.4g}): "
    )
    estimate = named.speed_ratio
    if estimate is None:
        sentence += (
            f"{named.tokens_per_s / ar.tokens_per_s:.3g}x in median tokens/s (no ratio measured "
            "in the same rounds)."
        )
    else:
        sentence += f"{estimate.text()} in the same rounds."
    return sentence + ties_text(named, [p for p in passing if p not in winners])


def passing_settings(points: Sequence[Point], rule: Mapping = HEADLINE_RULE) -> list[Point]:
    """The settings the headline chooses among: another family's, within ``ppl_ratio`` of the
    AR's perplexity and unmarked (empty without the AR's point)."""
    ar = next((p for p in points if p.key == (rule["ar_family"], rule["ar_setting"])), None)
    if ar is None:
        return []
    limit = rule["ppl_ratio"] * ar.judge_ppl
    return [
        p for p in points if p.family != rule["ar_family"] and p.judge_ppl <= limit and not mark(p)
    ]


def fastest_passing(passing: Sequence[Point]) -> list[Point]:
    """The fastest of ``passing`` by speed ratio to the AR (by median tokens/s when any of them
    has no ratio); a tie in speed goes to the lower perplexity, a tie in both keeps every tied
    point, by setting name."""
    speed = speed_key(passing)
    fastest = max(speed(p) for p in passing)
    top = [p for p in passing if speed(p) == fastest]
    best_ppl = min(p.judge_ppl for p in top)
    return sorted((p for p in top if p.judge_ppl == best_ppl), key=lambda p: p.setting)


def speed_key(points: Sequence[Point]):
    """What the headline ranks ``points`` by: the mean speed ratio when every one has it."""
    if all(p.speed_ratio is not None for p in points):
        return lambda p: p.speed_ratio.mean
    return lambda p: p.tokens_per_s


def ties_text(winner: Point, others: Sequence[Point]) -> str:
    """The passing settings whose perplexity interval overlaps the named one's: not separated
    from it in quality, so its speed lead over them is the whole story."""
    if winner.judge_ppl_ci95 is None:
        return " No perplexity interval: ties in quality not assessed."
    tied = sorted((p for p in others if overlaps(p, winner)), key=lambda p: -p.tokens_per_s)
    if not tied:
        return ""
    listed = ", ".join(f"{p.setting} ({p.tokens_per_s:,.0f} tokens/s)" for p in tied)
    return f" Tied with it in quality (overlapping perplexity intervals): {listed}."


# ---- into a report -----------------------------------------------------------------------------


def report_frontier(
    report: Report, runs: Mapping[int, Sequence[Point]], throughput: Throughput | None = None
) -> dict[str, Any]:
    """Add the frontier section to ``report``: the measurement table (when given), then per
    batch size the headline rule and its sentence, the front with and without marked points and
    the figure. The frontier uses the mean over seeds; returns what goes into report.json."""
    results: dict[str, Any] = {"rule": dict(HEADLINE_RULE)}
    report.text("## Speed-quality frontier")
    if throughput is not None:
        report.text(throughput.markdown())
        results["throughput"] = throughput.as_dict()
    report.text(HEADLINE_RULE["text"])
    batches = sorted({p.batch_size for points in runs.values() for p in points})
    for batch in batches:
        front = frontier(seed_means(runs, batch))
        try:
            sentence = headline(runs, batch)
        except ValueError as error:
            sentence = f"No headline: {error}."
        report.text(f"**Batch {batch}.** {sentence}")
        report.text(front_markdown(front))
        report.plot(
            f"frontier_batch{batch}",
            frontier_figure(front),
            f"Judge perplexity against generated tokens/s at batch {batch}; hollow: marked",
        )
        results[f"batch {batch}"] = {
            "headline": sentence,
            "per_seed": per_seed_results(runs, batch),
            "points": [asdict(p) for p in front.points],
            "marks": {p.setting: front.marks[p.key] for p in front.marked},
            "front": [p.setting for p in front.front],
            "front_unmarked": [p.setting for p in front.front_unmarked],
        }
    report.results["frontier"] = results
    return results


def per_seed_results(runs: Mapping[int, Sequence[Point]], batch_size: int) -> dict[str, Any]:
    """What each seed measured at ``batch_size`` (its points), and for the setting the headline
    names, its process ratios to the AR in each seed (what the interval is computed from)."""
    passing = passing_settings(seed_means(runs, batch_size))
    named = fastest_passing(passing)[0] if passing else None
    return {
        "points": {
            str(seed): [asdict(p) for p in points if p.batch_size == batch_size]
            for seed, points in sorted(runs.items())
        },
        "headline_setting": None if named is None else named.setting,
        "headline_ratios": [] if named is None else [list(r) for r in named.speed_ratios],
        "headline_ratio": None
        if named is None or named.speed_ratio is None
        else asdict(named.speed_ratio),
    }
