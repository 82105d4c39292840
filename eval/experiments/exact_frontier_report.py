"""The exact frontier's report: one row per sampler setting (the sampler's error with the exact
denoiser, the total error with the trained networks, the model's share, the speed ratio), the
positive controls, the likelihood gaps, the headline by ``exact_frontier_setup.headline``, and
the figure (distance to the truth against NFE per token and against the speed ratio)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from eval.experiments.exact_frontier_setup import (
    GEN_LENGTH,
    HEADLINE_METRIC,
    HEADLINE_NFE,
    LANGUAGE,
    MIN_PROB,
    Scale,
    headline,
    interval_text,
    sampler_settings,
    spread_of,
)
from eval.report import Report, Table

METRICS = ("tv", "kl_pq", "kl_qp")


def setting_row(setting, exact: dict, seeds: dict) -> dict[str, Any]:
    """One setting's numbers over the seeds; ``model_share`` = total - sampler, per metric."""
    sampler = exact[setting.name]
    row: dict[str, Any] = {
        "family": setting.family,
        "sampler_rule": setting.sampler,
        "setting": setting.name,
        "steps": setting.steps,
        "nfe_per_token": setting.nfe_per_token,
        "sampler_error": sampler,
        "dropped": max(s["total"][setting.name]["dropped"] for s in seeds.values()),
    }
    for metric in METRICS:
        totals = [s["total"][setting.name][metric] for s in seeds.values()]
        row[f"total_{metric}"] = totals
        row[f"model_share_{metric}"] = [t - sampler[metric] for t in totals]
    row["trained"] = spread_of(row[f"total_{HEADLINE_METRIC}"])
    row["sampler"] = {"mean": sampler[HEADLINE_METRIC]}
    row["speed_ratio"] = spread_of([s["speed"][setting.name] for s in seeds.values()], True)
    return row


def mean_or_inf(values: list[float]) -> float:
    return statistics.fmean(values) if all(map(math.isfinite, values)) else math.inf


def frontier_table(rows: list[dict[str, Any]]) -> Table:
    body = [
        [
            r["setting"],
            r["nfe_per_token"],
            r["sampler_error"]["tv"],
            interval_text(r["trained"]),
            statistics.fmean(r["model_share_tv"]),
            r["sampler_error"]["kl_pq"],
            interval_text(spread_of(r["total_kl_pq"])),
            r["sampler_error"]["kl_qp"],
            mean_or_inf(r["total_kl_qp"]),
            r["dropped"],
            interval_text(r["speed_ratio"]).replace("seeds", "seeds' runs"),
        ]
        for r in rows
    ]
    return Table(
        "Distance to the truth per sampler setting",
        [
            "setting",
            "NFE/token",
            "sampler TV",
            "total TV (trained)",
            "model share TV",
            "sampler KL(p||q)",
            "total KL(p||q)",
            "sampler KL(q||p)",
            "total KL(q||p)",
            "pruned mass",
            "speed / AR",
        ],
        body,
        note=f"Sampler: the exact denoiser in the same sampler (its own error, exact). Total: the "
        f"trained networks, mean with a 95% t-interval over the training seeds. Model share = "
        f"total - sampler (a difference, not a decomposition of a divergence: it can be "
        f"negative). KL(q||p) is infinite wherever q puts mass on an invalid string. Pruned "
        f"mass: the largest probability left out by pruning draws <= {MIN_PROB:g}. Speed: "
        f"tokens/s of real samples over the AR's in the same rounds (median over rounds).",
    )


def likelihood_table(seeds: dict) -> Table:
    first = next(iter(seeds.values()))["likelihood"]
    body = []
    for family, gap in first["families"].items():
        gaps = [s["likelihood"]["families"][family]["gap"] for s in seeds.values()]
        body.append([family.upper(), gap["kind"], interval_text(spread_of(gaps))])
    return Table(
        "Likelihood gap to the exact entropy rate",
        ["model", "estimate", "gap (nats/token)"],
        body,
        note=f"Entropy rate {first['entropy_nats_per_token']:.4f} nats/token (EOS counted). The "
        "per-token NLL (AR, exact) or Monte-Carlo NELBO (MDM, an upper bound) over every string "
        "of the language weighted by its probability; bd and udm are not computed here.",
    )


def controls_table(controls: list[dict[str, Any]]) -> Table:
    return Table(
        "Positive controls (exact denoiser; must be 0 to 1e-9, checked before the report)",
        ["setting", "largest of KL(q||p), KL(p||q), TV"],
        [[c["setting"], c["max_divergence"]] for c in controls],
    )


def curves(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(f"{row['family']} {row['sampler_rule']}", []).append(row)
    return {k: sorted(v, key=lambda r: r["nfe_per_token"]) for k, v in grouped.items()}


def figure(report: Report, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_nfe, by_speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    for index, (label, points) in enumerate(curves(rows).items()):
        colour = f"C{index}"
        nfe = [p["nfe_per_token"] for p in points]
        speed = [p["speed_ratio"]["mean"] for p in points]
        trained = [p["trained"]["mean"] for p in points]
        sampler = [p["sampler"]["mean"] for p in points]
        by_nfe.plot(nfe, trained, "o-", color=colour, label=f"{label} (trained)")
        by_nfe.plot(nfe, sampler, "x--", color=colour, label=f"{label} (exact denoiser)")
        by_speed.plot(speed, trained, "o-", color=colour)
        by_speed.plot(speed, sampler, "x--", color=colour)
    by_nfe.axvline(HEADLINE_NFE, color="grey", lw=0.8, ls=":")
    by_nfe.set_xlabel("NFE per token (model calls / generated positions)")
    by_speed.set_xlabel("measured speed / AR (tokens/s ratio)")
    by_speed.set_xscale("log")
    for axis in (by_nfe, by_speed):
        axis.set_ylabel("TV distance to the language")
        axis.grid(alpha=0.3)
    by_nfe.legend(fontsize=6, ncol=2)
    report.plot(
        "exact_frontier",
        fig,
        "Exact TV to the language: trained networks solid, exact denoiser dashed",
    )


def write_report(out, scale_name, scale: Scale, exact, controls, seeds, machine) -> dict[str, Path]:
    rows = [setting_row(s, exact, seeds) for s in sampler_settings(scale.every_setting)]
    head = headline(rows)
    report = Report(
        f"The exact frontier: sampler error vs model error (scale `{scale_name}`)",
        out,
        config={"scale": dataclasses.asdict(scale), "language": LANGUAGE, "gen_length": GEN_LENGTH},
        seeds={"train": list(scale.seeds), "speed": 0},
    )
    report.text(f"**Headline.** {head['text']}")
    report.text(INTRODUCTION)
    report.table(controls_table(controls))
    report.table(frontier_table(rows))
    report.table(likelihood_table(seeds))
    figure(report, rows)
    report.text(
        f"Wall time {machine['wall_seconds'] / 60:.1f} min on {machine['cpu']} "
        f"(training, exact distributions and timing)."
    )
    report.results.update(
        {"headline": head, "rows": rows, "controls": controls, "seeds": seeds, "machine": machine}
    )
    return report.write()


INTRODUCTION = (
    "Every distance below is exact: q, the distribution of strings the sampler produces, is "
    "enumerated, not sampled. The *sampler* error runs the sampler with the exact denoiser (the "
    "true conditional its network approximates), so it is the error of the sampler alone; the "
    "*total* error runs it with the trained network. The headline metric is TV, fixed before "
    "the run: it is finite for every family, while KL(q||p) is infinite for the uniform-state "
    "sampler at any finite step count and for every trained network (each gives an invalid "
    "string some mass). NFE per token is the number of model calls over the "
    f"{GEN_LENGTH} generated positions (the longest string and its EOS)."
)
