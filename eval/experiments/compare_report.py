"""The main comparison's report: the likelihood table, training throughput, the generation and
quality table, the frontier plots and the examples, as ``report.md``/``report.json``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from eval.experiments.compare_curves import budgets_section, sampling_checkpoint
from eval.experiments.compare_sections import (
    ReportInputs,
    Section,
    every,
    examples_section,
    frontier_section,
    generation_section,
    train_config,
)
from eval.experiments.compare_settings import headline_sets
from eval.experiments.compare_speed import speed_frontier_section
from eval.experiments.stages import training_seed
from eval.report import Report, Table


def tuning_section(
    report: Report, tuning: dict[str, Any] | None, objectives: tuple[str, ...] = ("ar", "mdm")
) -> None:
    """Where each model's learning rate came from, and the sweep's table when there was one."""
    if tuning is None:
        report.text(
            f"**Learning rates.** Not tuned in this run: {every(objectives)} models use the "
            "preset's learning rate (`--tune-lr` sweeps each objective's own)."
        )
        return
    budget = ", ".join(f"{name}={value:g}" for name, value in tuning["budget"].items())
    report.text(
        "**Learning rates.** Each objective's own, chosen by a sweep of short runs "
        f"({budget} each) at {len(tuning['ar']['table'])} learning rates around the "
        f"preset's {tuning['base_lr']:g}, on validation loss: "
        + ", ".join(f"{name.upper()} {tuning[name]['chosen']:.3g}" for name in objectives)
        + "."
    )
    rows = [
        [
            name.upper(),
            row["lr"],
            "diverged" if row["diverged"] else row["loss"],
            "chosen" if row["lr"] == tuning[name]["chosen"] else "",
        ]
        for name in objectives
        for row in tuning[name]["table"]
    ]
    report.table(
        Table(
            "Learning-rate sweep (validation nats/token of the short runs)",
            ["model", "learning rate", "validation", ""],
            rows,
        )
    )


def training_seeds(out: Path, objectives: tuple[str, ...] = ("ar", "mdm")) -> dict[str, int]:
    """{"train": seed} when every run used one seed (the usual case), else one entry per run."""
    seeds = {name: training_seed(out / name) for name in objectives}
    if len(set(seeds.values())) == 1:
        return {"train": seeds["ar"]}
    return {f"train_{name}": seed for name, seed in seeds.items()}


# report.json's results, in this order (a section may add to an earlier section's entry)
RESULT_KEYS = (
    "likelihood_raw",
    "generation",
    "quality",
    "examples",
    "training",
    "mdm_ar_perplexity_ratio",
    "perplexity_ratios",
    "budgets",
    "tuning",
    "speed_frontier",
    "wall_seconds",
)


def write_report(inputs: ReportInputs) -> dict[str, Path]:
    """Write report.md, report.json and the plots, one section after another (``SECTIONS``)."""
    report = new_report(inputs)
    kept: dict[str, Any] = {}
    for section in SECTIONS:
        for key, value in section(report, inputs).items():
            if isinstance(value, dict) and isinstance(kept.get(key), dict):
                kept[key] |= value
            else:
                kept[key] = value
    report.results.update({key: kept[key] for key in RESULT_KEYS if key in kept})
    return report.write()


def new_report(inputs: ReportInputs) -> Report:
    """The empty report with its configuration and seeds."""
    settings, summaries = inputs.settings, inputs.summaries
    families = inputs.families
    against = (
        "masked diffusion"
        if families == ("mdm",)
        else "diffusion (" + ", ".join(name.upper() for name in families) + ")"
    )
    return Report(
        f"AR vs {against}: preset `{inputs.preset}`",
        inputs.evaluation or inputs.out,
        config={
            "preset": inputs.preset,
            "settings": dataclasses.asdict(settings),
            "training": {k: v["data"] | {"steps": v["step"]} for k, v in summaries.items()},
        },
        seeds=training_seeds(inputs.main, settings.objectives)
        | {"sampling": 0, "budget_seeds": list(settings.seeds)},
        root=inputs.out,
        runs=[inputs.out],  # the runs, when the report is another generation length's
    )


def attention_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """The first line: how each model attends (a window changes the backbone for all)."""
    attention = inputs.attention
    report.text(
        "**Attention.** "
        + "; ".join(f"{name.upper()}: {pattern}" for name, pattern in attention.items())
        + "."
        + (
            f" Windowed attention changes the backbone for {every(inputs.settings.objectives)} "
            "objectives: the multiplier is not comparable with published full-attention values."
            if inputs.windowed
            else ""
        )
    )
    return {}


def headline_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """The likelihood and sample-quality headline paragraphs, and the wall time."""
    settings, likelihood, quality = inputs.settings, inputs.likelihood, inputs.quality
    ar_l = likelihood["ar"]["estimates"]["nll"]
    exact_bytes = likelihood["ar"]["protocol"]["tokenizer"].get("bytes_exact", True)
    byte_note = "" if exact_bytes else " (approximate: the tokenizer normalizes text)"
    ratios, bounds, gaps = {}, [], []
    for name in inputs.families:
        nelbo, family = likelihood[name]["estimates"]["nelbo"], name.upper()
        ratios[name] = math.exp(nelbo["nats_per_token"] - ar_l["nats_per_token"])
        low, high = nelbo["nats_per_token_ci95"]
        bounds.append(
            f"the {family} at most {nelbo['bits_per_byte']:.4f} (NELBO, 95% interval of the "
            f"per-token value [{low:.4f}, {high:.4f}] nats): {article(family)} {family}/AR "
            f"perplexity ratio of at most **{ratios[name]:.2f}**"
        )
        gap = inputs.analyses[name]["final_gap"]["text"]
        gaps.append(f"{family} - AR difference at the main budget is {gap} nats/token")
    ar_set, *family_sets = headline_sets(settings)
    judged = [
        f"the {name.upper()}'s ({set_name}) {judge_text(quality['sets'][set_name])}"
        for name, set_name in zip(inputs.families, family_sets, strict=True)
    ]
    report.text(
        f"**Likelihood.** On the same {ar_l['tokens']:,} validation tokens the AR model of seed "
        f"{settings.seeds[0]} scores "
        f"{ar_l['bits_per_byte']:.4f} bits/byte{byte_note} (exact NLL) and "
        + "; ".join(bounds)
        + f" after {inputs.summaries['ar']['tokens_seen']:,} training tokens each"
        f"{schedule_note(inputs.summaries)} "
        + ("(published" if inputs.families == ("mdm",) else "(published for the MDM")
        + ": about 1.2-1.3 at large compute, larger at small compute). Over "
        f"{len(settings.seeds)} training seed(s) the paired "
        + ", the paired ".join(gaps)
        + " (one fixed noise draw per row).\n\n"
        f"**Samples.** The judge ({quality['judge']}) gives AR samples at temperature 1 a "
        f"perplexity of {judge_text(quality['sets'][ar_set])} and "
        + ", ".join(judged)
        + " (95% intervals over the samples, of the first seed's models); held-out text scores "
        f"{quality['reference']['judge_ppl']:.1f}. The frontier below shows what each diffusion "
        "sampler buys per network evaluation. " + wall_time_text(inputs)
    )
    return {"mdm_ar_perplexity_ratio": ratios.get("mdm"), "perplexity_ratios": ratios}


def article(initialism: str) -> str:
    """ "an" before an initialism read with a vowel sound (an MDM), else "a" (a UDM, a BD)."""
    return "an" if initialism[0] in "AEFHILMNORSX" else "a"


def wall_time_text(inputs: ReportInputs) -> str:
    return f"Wall time of this invocation: {inputs.wall_seconds / 60:.1f} min" + (
        f" (reused from an earlier run: {', '.join(inputs.reused)})."
        if inputs.reused
        else ", every stage computed."
    )


def schedules_text(inputs: ReportInputs) -> str:
    """Each objective's warmup and peak learning rate, and the budgets' shared cooldown."""
    trained = {name: train_config(inputs.main / name) for name in inputs.summaries}
    schedules = "; ".join(
        f"{name.upper()} warmup {cfg['warmup_steps']} steps, peak learning rate {cfg['lr']:g}"
        for name, cfg in trained.items()
    )
    cooldown = trained["ar"]["cooldown_fraction"]
    return schedules + (
        f"; each budget cools down over its last {cooldown:.0%} of steps, linearly to "
        f"{trained['ar']['min_lr_ratio']:g}x"
    )


def compute_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """The budget frontiers and M(L) (``budgets_section``)."""
    curves = budgets_section(
        report,
        inputs.runs,
        inputs.analysis,
        inputs.unigram,
        inputs.windowed,
        schedules_text(inputs),
        inputs.analyses,
    )
    return {"budgets": curves | {"attention": inputs.attention}}


def learning_rate_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    tuning_section(report, inputs.tuning, inputs.settings.objectives)
    return {"tuning": inputs.tuning}


def sampling_source_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """Which checkpoint each model's samples come from, said when it is not the final one."""
    sources = {
        name: sampling_checkpoint(inputs.main / name)[1] for name in inputs.settings.objectives
    }
    if any(label != "final checkpoint" for label in sources.values()):
        report.text(
            "**Samples come from:** "
            + "; ".join(f"{name.upper()}: {label}" for name, label in sources.items())
            + "."
        )
    return {"budgets": {"sampling_checkpoints": sources}}


def likelihood_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """Every model on the same validation rows (AR: exact NLL; each diffusion family: its NELBO,
    an upper bound); the MDM's exact left-to-right NLL beside its NELBO on the first rows."""
    likelihood, chain_rows = inputs.likelihood, inputs.settings.chain_rule_rows
    rows = {"AR": likelihood["ar"]["estimates"]["nll"] | {"protocol": likelihood["ar"]["protocol"]}}
    for name in inputs.families:
        rows[name.upper()] = likelihood[name]["estimates"]["nelbo"] | {
            "protocol": likelihood[name]["protocol"]
        }
    mdm = likelihood.get("mdm", {"estimates": {}})
    if "chain_rule_nll" in mdm["estimates"]:
        rows[f"MDM left-to-right (first {chain_rows} rows)"] = mdm["estimates"][
            "chain_rule_nll"
        ] | {"protocol": mdm["protocol"]}
        rows[f"MDM NELBO (same {chain_rows} rows)"] = mdm["estimates"][
            "nelbo_on_chain_rule_rows"
        ] | {"protocol": mdm["protocol"]}
    report.likelihood_table("Validation likelihood (same rows, same protocol)", rows)
    return {"likelihood_raw": likelihood}


def training_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """Parameters, tokens, throughput and MFU of the first seed's main runs."""
    summaries = inputs.summaries
    # One peak for every row: the start-up matmul measurement is noisy on a shared machine.
    peak = max(s["peak_flops"] for s in summaries.values())
    report.table(
        Table(
            "Training",
            ["model", "parameters", "tokens seen", "train tokens/s", "MFU", "precision"],
            [
                [
                    k.upper(),
                    s["parameters"],
                    s["tokens_seen"],
                    s["train_tokens_per_s"],
                    f"{(s['train_tokens_per_s'] or 0) * s['flops_per_token'] / peak:.1%}",
                    s["precision"],
                ]
                for k, s in summaries.items()
            ],
            note=f"MFU (a percentage, as the progress bar shows it; metrics.jsonl keeps the "
            f"fraction) against one peak of {peak / 1e12:.3g} TFLOP/s for "
            f"{every(tuple(summaries))} rows ({summaries['ar']['peak_flops_source']}); FLOPs by "
            "the config count (6N + attention), the same formula for "
            f"{every(tuple(summaries))} objectives.",
        )
    )
    return {"training": summaries}


SECTIONS: tuple[Section, ...] = (
    attention_section,
    headline_section,
    compute_section,
    learning_rate_section,
    sampling_source_section,
    likelihood_section,
    training_section,
    generation_section,
    frontier_section,
    speed_frontier_section,
    examples_section,
)


def judge_text(row: dict[str, Any]) -> str:
    """A judge perplexity with its interval over samples and its relative half-width."""
    interval = row.get("judge_ppl_ci95")
    if not interval:
        return f"{row['judge_ppl']:.1f} ({row.get('samples', '?')} samples, no interval)"
    half = (interval[1] - interval[0]) / 2 / row["judge_ppl"]
    return (
        f"{row['judge_ppl']:.1f} [{interval[0]:.1f}, {interval[1]:.1f}] "
        f"({row['samples']} samples, +-{half:.0%})"
    )


def schedule_note(summaries: dict[str, dict[str, Any]]) -> str:
    """Empty for runs trained under one schedule; for a run continued to a larger budget, how
    its learning-rate schedule changed on the way (it is not a run scheduled for that budget)."""
    notes = []
    for name, summary in summaries.items():
        history = summary.get("schedule_history") or []
        if len(history) > 1:
            legs = [
                ("from step 0" if i == 0 else f"then from step {leg['from_step']}")
                + f" under a {leg['total_steps']}-step schedule"
                for i, leg in enumerate(history)
            ]
            notes.append(f"{name.upper()} trained {', '.join(legs)}")
    if not notes:
        return ""
    return " (continued runs, not runs scheduled for this budget: " + "; ".join(notes) + ")"
