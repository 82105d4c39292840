"""The comparison's compute sections: the budget frontiers, M(L) with its interval over seeds
and the exponents (numbers from ``eval.experiments.compare_budgets``); and which checkpoint a
run's samples come from, from its own validation records (its best one when it overfit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval.report import Report, Table
from shared.checkpoint import checkpoint_name, read_best
from shared.training.metrics import metric_records
from shared.validation import standard_error

# Nie et al. 2024 ("Scaling up Masked Diffusion Models on Text", SMDM): an MDM needs about 16x
# the compute of an AR model to reach the same validation loss.
PUBLISHED_MULTIPLIER = 16.0
Z95 = 1.959964
COLOURS = {
    "ar": "tab:blue",
    "mdm": "tab:orange",
    "udm": "tab:green",
    "bd": "tab:red",
    "eso": "tab:purple",
}
OVERFIT_TOLERANCE = 0.01  # final validation more than 1% above the best: say so


def eval_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's validation records in step order, one per step and kind (curve point or not,
    rows validated on); a resumed run's last word wins."""
    by_step: dict[tuple[int, bool, int], dict[str, Any]] = {}
    for _, record in metric_records(run_dir / "metrics.jsonl"):
        if record.get("kind") == "eval":
            by_step[record["step"], bool(record.get("on_curve")), record.get("val_tokens", 0)] = (
                record
            )
    return [by_step[key] for key in sorted(by_step)]


def read_curve(run_dir: Path) -> list[dict[str, Any]]:
    """The run's learning-curve records, one per step (a resumed run's last word wins)."""
    return [record for record in eval_records(run_dir) if record.get("on_curve")]


def points(curve: list[dict[str, Any]], band: float = 0.0) -> list[tuple[float, float]]:
    """(FLOPs, nats/token + band x its 95% half-width) of each record."""
    return [(r["flops"], r["val_nats_per_token"] + band * Z95 * standard_error(r)) for r in curve]


def best_and_final(curve: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(curve, key=lambda r: r["val_nats_per_token"])
    final = curve[-1]
    rise = final["val_nats_per_token"] / best["val_nats_per_token"] - 1
    return {
        "best_step": best["step"],
        "best": best["val_nats_per_token"],
        "final_step": final["step"],
        "final": final["val_nats_per_token"],
        "overfits": rise > OVERFIT_TOLERANCE,
        "rise": rise,
    }


def sampling_checkpoint(run_dir: Path) -> tuple[Path, str]:
    """Where a run's samples come from: its best checkpoint when its validation rose more than 1%
    after its best point (overfitting), else its newest; and a label saying which."""
    curve = read_curve(run_dir)
    best = read_best(run_dir / "checkpoints")
    if len(curve) >= 2 and best_and_final(curve)["overfits"] and best is not None:
        path = run_dir / "checkpoints" / checkpoint_name(best["step"])
        if path.is_dir():
            return path, f"best checkpoint (step {best['step']}; validation rose after it)"
    return run_dir, "final checkpoint"


def budgets_section(
    report: Report,
    runs: dict[int, dict[str, Any]],
    analysis: dict[str, Any],
    unigram: float,
    windowed: bool,
    schedules: str = "",
    analyses: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Add the budget frontiers, M(L), the headline multiplier with its interval over seeds and
    the exponents to ``report``; returns what report.json keeps of them. ``analyses``: one
    ``multiplier_analysis`` per diffusion family (default: ``analysis``, the MDM's), each
    against AR; ``analysis`` is the headline family's."""
    analyses = analyses or {analysis.get("family", "mdm"): analysis}
    alone = len(analyses) == 1
    for index, (family, family_analysis) in enumerate(analyses.items()):
        first = index == 0
        report.text(
            multiplier_text(
                runs, family_analysis, unigram, windowed, schedules, family, first, alone
            )
        )
    report.plot(
        "budget_frontiers",
        frontier_figure(runs, unigram),
        "Validation loss at each budget (one run per budget), per seed",
    )
    for index, (family, family_analysis) in enumerate(analyses.items()):
        name = "multiplier_curve" if index == 0 else f"multiplier_curve_{family}"
        caption = "M(L) per seed" if alone else f"M(L) of the {family.upper()} per seed"
        report.plot(name, multiplier_figure(family_analysis, windowed, family), caption)
    report.table(budget_points_table(runs, analysis, unigram))
    for family, family_analysis in analyses.items():
        multiplier_table(report, family_analysis, "" if alone else family)
    return {
        "points": {seed: run["points"] for seed, run in runs.items()},
        "analysis": analysis,
        "analyses": analyses,
        "published_multiplier": None if windowed else PUBLISHED_MULTIPLIER,
        "published_comparable": not windowed,
    }


def published_text(family: str, windowed: bool) -> str:
    """The published multiplier the family's M is set beside: SMDM's, for masked diffusion at
    full attention only."""
    if family != "mdm":
        return f"none for the {family.upper()} (SMDM's 16x is masked diffusion's)"
    if windowed:
        return "not comparable (windowed attention)"
    return f"{PUBLISHED_MULTIPLIER:.0f}x (Nie et al. 2024, SMDM; full attention)"


def multiplier_text(
    runs: dict[int, dict[str, Any]],
    analysis: dict[str, Any],
    unigram: float,
    windowed: bool,
    schedules: str,
    family: str = "mdm",
    first: bool = True,
    alone: bool = True,
) -> str:
    """The paragraph on one diffusion family's budgets against AR: how they were trained (the
    first family's paragraph), the rule, the headline M, the published value, the exponents."""
    name = family.upper()
    counts = "; ".join(
        f"seed {seed}: AR {s['past_plateau']['ar']}, {name} {s['past_plateau'][family]}"
        for seed, s in analysis["seeds"].items()
    )
    exponents = analysis["exponents"]
    heading = "**Compute multiplier over budgets" + ("" if alone else f", {name} against AR")
    intro = (
        ".** Each objective is trained at several budgets, each "
        "a run scheduled for its own length (warmup-stable-decay; the shorter budgets are "
        "cooldown branches of the longest run), and validated on the whole split at its end"
        + (f" (schedules: {schedules})" if schedules else "")
        + ". "
    )
    return (
        heading
        + (intro if first else ".** ")
        + f"M(L) = C_{name}(L) / C_AR(L) is read where both frontiers cover L, using only points "
        f"more than {analysis['plateau_margin']:g} nats below the unigram entropy "
        f"({unigram:.3f}); points past the plateau per seed: {counts}. Rule, fixed before the "
        f"run: the headline is M at {analysis['rule']}. Headline: "
        + headline_summary(list(runs), analysis, first)
        + f". Published: {published_text(family, windowed)}. "
        f"Log-log exponents (L ~ C^-alpha over the points past the plateau): AR "
        + spread_text(exponents["ar"])
        + f", {name} "
        + spread_text(exponents[family])
        + f"; paired {name} - AR difference "
        + spread_text(analysis["exponent_difference"])
        + " (0 is parallel scaling, a constant multiplier). M at the headline level from the two "
        "fits instead of interpolation: " + spread_text(analysis["fitted_multiplier"]) + "."
    )


def headline_summary(seeds: list[int], analysis: dict[str, Any], first: bool = True) -> str:
    """The headline M with its interval over seeds and each seed's value, or why it is not
    measured; with one seed, how to get an interval (said once, in the first family's)."""
    headline = analysis["multiplier"]
    if headline is None:
        summary = (
            "**not measured**: in no seed do both frontiers, past the plateau, cover the "
            "headline loss"
        )
    else:
        summary = f"**{headline['text']}x** (geometric mean over {len(headline['values'])} seed(s)"
        summary += (
            ", 95% t-interval over seeds)" if headline["low"] is not None else "; no interval)"
        )
        summary += "; per seed " + ", ".join(
            f"{seed}: {s['multiplier']:.3g}x at {s['headline_loss']:.3f} nats"
            for seed, s in analysis["seeds"].items()
            if s["multiplier"] is not None
        )
    if analysis["unmeasured_seeds"]:
        unmeasured = ", ".join(str(seed) for seed in analysis["unmeasured_seeds"])
        summary += f"; not measured at seed(s) {unmeasured}"
    if len(seeds) == 1 and first:
        summary += (
            f". This run trained one seed ({seeds[0]}), so no interval covers training "
            "randomness: rerun with `--seeds 0,1,2` for one (each seed trains every budget point "
            "again; the demo's default is one seed because that is what fits its 15 minutes on a "
            "2-core CPU)"
        )
    return summary


def budget_points_table(
    runs: dict[int, dict[str, Any]], analysis: dict[str, Any], unigram: float
) -> Table:
    """Every budget point of every seed: its loss with an interval, and whether it is past the
    plateau."""
    families = [name.upper() for name in next(iter(runs.values()))["points"] if name != "ar"]
    return Table(
        "Budget points (final validation of each budget's run, whole split)",
        ["seed", "model", "steps", "FLOPs", "nats/token", "95%", "bits/byte", "past plateau"],
        [
            [
                seed,
                name.upper(),
                p["steps"],
                p["flops"],
                p["loss"],
                interval_text(p),
                p["bpb"],
                "yes" if p["loss"] < unigram - analysis["plateau_margin"] else "no",
            ]
            for seed in runs
            for name in runs[seed]["points"]
            for p in runs[seed]["points"][name]
        ],
        note=f"{', '.join(families)}: NELBO with the run's fixed validation noise (an upper "
        "bound); AR: exact NLL. The interval is over validation rows (and noise), within one "
        "training run.",
    )


def multiplier_table(report: Report, analysis: dict[str, Any], family: str = "") -> None:
    """M(L) per seed at evenly spaced losses, or a sentence saying it is read nowhere;
    ``family`` names the diffusion family in the title (when there are several)."""
    grid = sorted({round(loss, 3) for s in analysis["seeds"].values() for loss, _ in s["curve"]})
    title = "M(L) per seed at evenly spaced losses of each seed's shared range"
    if family:
        title += f" ({family.upper()} against AR)"
    rows = [[seed, loss, m] for seed, s in analysis["seeds"].items() for loss, m in s["curve"]]
    if rows:
        report.table(
            Table(
                title,
                ["seed", "loss (nats/token)", "M"],
                rows,
                note=f"{len(grid)} loss levels in all; interpolated in log-log between budget "
                "points, never extrapolated.",
            )
        )
    else:  # a table of no rows would read as if something were measured
        report.text(
            f"**{title}:** none; in no seed do the two frontiers, past the plateau, share a "
            "range of losses, so M(L) is read nowhere."
        )


def spread_text(spread: dict[str, Any] | None) -> str:
    return (
        "not measured (fewer than 4 points past the plateau)" if spread is None else spread["text"]
    )


def interval_text(point: dict[str, Any]) -> str:
    if point.get("loss_se") is None:
        return "-"
    half = Z95 * point["loss_se"]
    return f"[{point['loss'] - half:.4f}, {point['loss'] + half:.4f}]"


def frontier_figure(runs: dict[int, dict[str, Any]], unigram: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for index, run in enumerate(runs.values()):
        for name, points in run["points"].items():
            axis.plot(
                [p["flops"] for p in points],
                [p["loss"] for p in points],
                marker="o",
                color=COLOURS.get(name, "tab:gray"),
                alpha=0.9 if index == 0 else 0.35,
                label=None
                if index
                else f"{name.upper()} " + ("(exact NLL)" if name == "ar" else "(NELBO)"),
            )
    axis.axhline(unigram, color="gray", linestyle="--", label="unigram entropy (plateau)")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("training FLOPs (one run per budget)")
    axis.set_ylabel("validation nats/token")
    axis.set_title(f"Budget frontiers, {len(runs)} seed(s) (first seed solid)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    return figure


def multiplier_figure(analysis: dict[str, Any], windowed: bool, family: str = "mdm"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for index, s in enumerate(analysis["seeds"].values()):
        if s["curve"]:
            axis.plot(
                [loss for loss, _ in s["curve"]],
                [m for _, m in s["curve"]],
                color="tab:purple",
                alpha=0.9 if index == 0 else 0.35,
                label="M(L), one line per seed" if index == 0 else None,
            )
        if s["multiplier"] is not None:
            axis.plot([s["headline_loss"]], [s["multiplier"]], "k*", markersize=9)
    if not windowed and family == "mdm":
        axis.axhline(PUBLISHED_MULTIPLIER, color="gray", linestyle="--", label="published (SMDM)")
    axis.set_yscale("log")
    axis.invert_xaxis()
    axis.set_xlabel("validation loss L (nats/token; better to the right)")
    axis.set_ylabel(f"C_{family.upper()}(L) / C_AR(L)")
    axis.set_title("Compute multiplier vs loss (stars: the headline level)")
    axis.grid(alpha=0.3, which="both")
    if axis.get_legend_handles_labels()[0]:  # nothing measured and nothing published: no legend
        axis.legend(fontsize=8)
    return figure
