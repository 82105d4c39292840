"""The exact frontier's report: per language, one row per sampler setting (TV to the language
with each exact denoiser and with the trained networks, TV between those two outputs, the mass
that reaches an impossible canvas, the speed ratio on the headline language), the positive
controls, the likelihood gaps, the headline by ``exact_frontier_setup.headline`` (read on the
full-support language), the corrector verdicts and the EB table
(``exact_frontier_correctors``) and the figure (distance to the truth against NFE per token and
against the speed ratio)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from eval.experiments.exact_frontier_correctors import (
    corrector_summary,
    corrector_table,
    corrector_text,
    corrector_verdicts,
    eb_rows,
    eb_table,
)
from eval.experiments.exact_frontier_setup import (
    GEN_LENGTH,
    HEADLINE_METRIC,
    HEADLINE_NFE,
    LANGUAGES,
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
    """One setting's numbers over the seeds, with each exact denoiser ("oracle") of its family;
    ``to_exact`` is TV(q trained, q of the first oracle), a distance, not a difference."""
    by_oracle = {
        oracle: {k: v for k, v in error.items() if k != "q"}
        for oracle, error in exact[setting.name].items()
    }
    first = next(iter(by_oracle))
    nfe = setting.nfe_per_token
    exact_calls = by_oracle[first].get("calls")
    if nfe is None:  # open-ended: the trained networks' expected calls, mean over seeds
        nfe = statistics.fmean(s["total"][setting.name]["calls"] for s in seeds.values())
        nfe /= GEN_LENGTH
    row: dict[str, Any] = {
        "family": setting.family,
        "sampler_rule": setting.sampler,
        "setting": setting.name,
        "steps": setting.steps,
        "nfe_per_token": nfe,
        "exact_nfe_per_token": None if exact_calls is None else exact_calls / GEN_LENGTH,
        "exact_denoiser": by_oracle,
        "dropped": max(s["total"][setting.name]["dropped"] for s in seeds.values()),
    }
    for metric in METRICS:
        row[f"total_{metric}"] = [s["total"][setting.name][metric] for s in seeds.values()]
    row["trained"] = spread_of(row[f"total_{HEADLINE_METRIC}"])
    tvs = [error[HEADLINE_METRIC] for error in by_oracle.values()]
    row["sampler"] = {"oracle": first, "mean": tvs[0], "low": min(tvs), "high": max(tvs)}
    row["to_exact_by_oracle"] = {
        oracle: spread_of([s["total"][setting.name]["tv_to_exact"][oracle] for s in seeds.values()])
        for oracle in by_oracle
    }
    row["to_exact"] = row["to_exact_by_oracle"][first]
    if all("speed" in s for s in seeds.values()):
        row["speed_ratio"] = spread_of([s["speed"][setting.name] for s in seeds.values()], True)
    return row


def mean_or_inf(values: list[float]) -> float:
    return statistics.fmean(values) if all(map(math.isfinite, values)) else math.inf


def frontier_table(rows: list[dict[str, Any]], name: str) -> Table:
    """The headline language's table: one exact denoiser per setting."""
    body = [
        [
            r["setting"],
            r["nfe_per_token"],
            r["sampler"]["mean"],
            interval_text(r["trained"]),
            interval_text(r["to_exact"]),
            r["exact_denoiser"]["exact"]["kl_pq"],
            interval_text(spread_of(r["total_kl_pq"])),
            r["exact_denoiser"]["exact"]["kl_qp"],
            mean_or_inf(r["total_kl_qp"]),
            r["dropped"],
            interval_text(r["speed_ratio"]).replace("seeds", "seeds' runs"),
        ]
        for r in rows
    ]
    return Table(
        f"Language `{name}` (headline, full support): distances per sampler setting",
        [
            "setting",
            "NFE/token",
            "TV(q exact denoiser, p)",
            "TV(q trained, p)",
            "TV(q trained, q exact denoiser)",
            "KL(p||q) exact denoiser",
            "KL(p||q) trained",
            "KL(q||p) exact denoiser",
            "KL(q||p) trained",
            "pruned mass",
            "speed / AR",
        ],
        body,
        note="q exact denoiser: the sampler run with the exact denoiser (unique on this "
        "language: every canvas it reaches is possible). q trained: the trained networks, mean "
        "with a 95% t-interval over the training seeds. TV(q trained, q exact denoiser) is the "
        "exact distance between the two output distributions, a third number beside the two "
        "distances to p, not a part of either. KL(q||p) is infinite wherever q puts mass on a "
        f"string p does not hold. Pruned mass: the largest probability left out by pruning "
        f"draws <= {MIN_PROB:g}. Speed: tokens/s of real samples over the AR's in the same "
        "rounds (median over rounds).",
    )


def by_oracle_text(values: dict[str, Any]) -> str:
    return "; ".join(f"{oracle}: {value}" for oracle, value in values.items())


def impossible_text(row: dict[str, Any]) -> str:
    """The mass is one number: every completion agrees with the true conditionals until the
    sampler reaches an impossible canvas, so the paths that reach one are the same."""
    mass = next(iter(row["exact_denoiser"].values()))["impossible"]
    return "none reachable" if mass is None else f"{mass:.3g}"


def variable_table(rows: list[dict[str, Any]], name: str, share: float) -> Table:
    """A language with impossible canvases: every exact denoiser's number, never one alone."""
    body = [
        [
            r["setting"],
            r["nfe_per_token"],
            impossible_text(r),
            by_oracle_text({o: f"{e['tv']:.3g}" for o, e in r["exact_denoiser"].items()}),
            interval_text(r["trained"]),
            by_oracle_text({o: interval_text(v) for o, v in r["to_exact_by_oracle"].items()}),
        ]
        for r in rows
    ]
    return Table(
        f"Language `{name}` (strings of 1-{LANGUAGES[name]['max_len']} symbols): distances "
        "per sampler setting under each exact denoiser",
        [
            "setting",
            "NFE/token",
            "mass reaching an impossible canvas",
            "TV(q exact denoiser, p)",
            "TV(q trained, p)",
            "TV(q trained, q exact denoiser)",
        ],
        body,
        note="EOS and PAD stand inside the generated positions, so a k-per-step masked sampler "
        "reaches canvases no row holds, where the true conditional is undefined. MDM and BD "
        "are given under two completions that agree with it wherever the evidence is possible: "
        "uniform (uniform over the row symbols) and prefix (condition on the longest possible "
        "run of tokens from the start: the tokens up to the first EOS where the conflict is "
        "after it); the mass column is the probability the sampler reaches such a canvas "
        "(the same under both: the completions differ only there). AR's exact denoiser is "
        "unique; the uniform-state channel makes every noisy canvas possible. UDM trains on "
        f"packed rows cut at fixed offsets ({share:.0%} of them start at a document boundary): "
        "packed is the oracle of those rows (a row starts at the packed stream's stationary "
        "state), boundary the oracle of rows that start at a document, which a sample needs.",
    )


def likelihood_table(seeds: dict, name: str) -> Table:
    first = next(iter(seeds.values()))["likelihood"]
    body = []
    for family, gap in first["families"].items():
        gaps = [s["likelihood"]["families"][family]["gap"] for s in seeds.values()]
        body.append([family.upper(), gap["kind"], interval_text(spread_of(gaps))])
    return Table(
        f"Language `{name}`: likelihood gap to the exact entropy rate",
        ["model", "estimate", "gap (nats/token)"],
        body,
        note=f"Entropy rate {first['entropy_nats_per_token']:.4f} nats/token (EOS counted). The "
        "per-token NLL (AR, exact) or Monte-Carlo NELBO (MDM, an upper bound) over every string "
        "of the language weighted by its probability; bd and udm are not computed here.",
    )


def controls_table(controls: list[dict[str, Any]], name: str) -> Table:
    return Table(
        f"Language `{name}`: positive controls (exact denoiser; must be 0 to 1e-9, checked "
        "before the report)",
        ["setting", "exact denoiser", "largest of KL(q||p), KL(p||q), TV"],
        [[c["setting"], c["oracle"], c["max_divergence"]] for c in controls],
    )


def protocol_text(results: dict[str, dict]) -> str:
    shares = ", ".join(
        f"`{name}` {result['boundary_share']:.0%}" for name, result in results.items()
    )
    return (
        "**Rows each family trains on.** AR, MDM and BD train on padded rows, one document "
        "each starting at the row's start: the rows their exact denoisers assume. UDM trains "
        "on packed rows cut at fixed offsets (its objective has no PAD in its support); the "
        f"share of those rows that start at a document boundary is {shares}. On the "
        "full-support language every document and its EOS fill a row exactly, so every packed "
        "row starts at a boundary and the UDM's exact denoiser (rows that start at a "
        "document) is the oracle of the rows it trained on. On the variable-length language "
        "the UDM is measured against the oracle of its packed rows, with the boundary oracle "
        "beside it."
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

    fig, (by_nfe, by_speed) = plt.subplots(1, 2, figsize=(13, 5))
    palette = plt.get_cmap("tab20")
    for index, (label, points) in enumerate(curves(rows).items()):
        colour = palette(index % 20)
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


def write_report(out, scale_name, scale: Scale, headline_name, results, machine) -> dict[str, Path]:
    settings = sampler_settings(scale.every_setting)
    rows = {
        name: [setting_row(s, result["exact"], result["seeds"]) for s in settings]
        for name, result in results.items()
    }
    head = headline(rows[headline_name]) | {"language": headline_name}
    report = Report(
        f"The exact frontier: distances to the truth with the exact denoiser and the trained "
        f"network (scale `{scale_name}`)",
        out,
        config={
            "scale": dataclasses.asdict(scale),
            "languages": LANGUAGES,
            "headline_language": headline_name,
            "gen_length": GEN_LENGTH,
        },
        seeds={"train": list(scale.seeds), "speed": 0},
    )
    verdicts = corrector_verdicts(rows[headline_name])
    summary = corrector_summary(verdicts)
    report.text(f"**Headline** (language `{headline_name}`). {head['text']}")
    report.text(corrector_text(summary))
    report.text(INTRODUCTION)
    report.text(protocol_text(results))
    for name, result in results.items():
        report.table(controls_table(result["controls"], name))
        if name == headline_name:
            report.table(frontier_table(rows[name], name))
            report.table(corrector_table(verdicts))
            report.table(eb_table(rows[name]))
        else:
            report.table(variable_table(rows[name], name, result["boundary_share"]))
        report.table(likelihood_table(result["seeds"], name))
    figure(report, rows[headline_name])
    report.text(
        f"Wall time {machine['wall_seconds'] / 60:.1f} min on {machine['cpu']} "
        f"(training, exact distributions and timing)."
    )
    report.results.update(
        {
            "headline": head,
            "correctors": {"verdicts": verdicts, "summary": summary},
            "eb": eb_rows(rows[headline_name]),
            "languages": {
                name: {
                    "rows": rows[name],
                    "controls": result["controls"],
                    "seeds": result["seeds"],
                    "boundary_share": result["boundary_share"],
                }
                for name, result in results.items()
            },
            "machine": machine,
        }
    )
    return report.write()


INTRODUCTION = (
    "Every distance below is exact: q, the distribution of strings the sampler produces, is "
    "enumerated, not sampled. Each setting gives three distances: TV(q exact denoiser, p), the "
    "sampler run with the exact denoiser (the true conditional its network approximates); "
    "TV(q trained, p), the sampler run with the trained network; and TV(q trained, q exact "
    "denoiser), how far the trained network moves the sampler's output. None is a share of "
    "another: TV is a distance, and the first two need not add up to anything. The headline "
    "metric is TV, fixed before the run: it is finite for every family, while KL(q||p) is "
    "infinite for the uniform-state sampler at any finite step count and for every trained "
    "network (each gives a string p does not hold some mass). NFE per token is the number of "
    f"model calls over the {GEN_LENGTH} generated positions (the longest string and its EOS; "
    "on the full-support language the EOS is always the last of them)."
)
