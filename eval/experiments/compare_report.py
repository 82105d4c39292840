"""The main comparison's report: the likelihood table, training throughput, the generation and
quality table, the frontier plots and the examples, as ``report.md``/``report.json``."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from eval.experiments.compare_budgets import (
    attention_pattern,
    multiplier_analysis,
    seed_folder,
)
from eval.experiments.compare_curves import budgets_section, sampling_checkpoint
from eval.experiments.compare_settings import CompareSettings, headline_sets
from eval.experiments.stages import training_seed
from eval.report import Report, Table, frontier_figure


def tuning_section(report: Report, tuning: dict[str, Any] | None) -> None:
    """Where each model's learning rate came from, and the sweep's table when there was one."""
    if tuning is None:
        report.text(
            "**Learning rates.** Not tuned in this run: both models use the preset's learning "
            "rate (`--tune-lr` sweeps each objective's own)."
        )
        return
    budget = ", ".join(f"{name}={value:g}" for name, value in tuning["budget"].items())
    report.text(
        "**Learning rates.** Each objective's own, chosen by a sweep of short runs "
        f"({budget} each) at {len(tuning['ar']['table'])} learning rates around the "
        f"preset's {tuning['base_lr']:g}, on validation loss: AR {tuning['ar']['chosen']:.3g}, "
        f"MDM {tuning['mdm']['chosen']:.3g}."
    )
    rows = [
        [
            name.upper(),
            row["lr"],
            "diverged" if row["diverged"] else row["loss"],
            "chosen" if row["lr"] == tuning[name]["chosen"] else "",
        ]
        for name in ("ar", "mdm")
        for row in tuning[name]["table"]
    ]
    report.table(
        Table(
            "Learning-rate sweep (validation nats/token of the short runs)",
            ["model", "learning rate", "validation", ""],
            rows,
        )
    )


def model_config(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "config.json").read_text())["model_config"]


def train_config(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "config.json").read_text())["train_config"]


def training_seeds(out: Path) -> dict[str, int]:
    """{"train": seed} when both runs used one seed (the usual case), else one entry per run."""
    seeds = {name: training_seed(out / name) for name in ("ar", "mdm")}
    if seeds["ar"] == seeds["mdm"]:
        return {"train": seeds["ar"]}
    return {f"train_{name}": seed for name, seed in seeds.items()}


def write_report(
    out: Path,
    preset: str,
    runs: dict[int, dict[str, Any]],
    likelihood: dict[str, Any],
    sets: dict[str, Any],
    quality: dict[str, Any],
    examples: dict[str, Any],
    settings: CompareSettings,
    wall_seconds: float,
    reused: list[str],
    unigram: float,
    tuning: dict[str, Any] | None = None,
) -> dict[str, Path]:
    main = seed_folder(out, settings.seeds[0])
    summaries = runs[settings.seeds[0]]["summaries"]
    attention = {
        name: attention_pattern(
            summary["objective"], model_config(main / name).get("sliding_window", 0)
        )
        for name, summary in summaries.items()
    }
    windowed = any(model_config(main / name).get("sliding_window", 0) for name in summaries)
    report = Report(
        f"AR vs masked diffusion: preset `{preset}`",
        out,
        config={
            "preset": preset,
            "settings": dataclasses.asdict(settings),
            "training": {k: v["data"] | {"steps": v["step"]} for k, v in summaries.items()},
        },
        seeds=training_seeds(main) | {"sampling": 0, "budget_seeds": list(settings.seeds)},
    )
    report.text(
        f"**Attention.** AR: {attention['ar']}; MDM: {attention['mdm']}."
        + (
            " Windowed attention changes the backbone for both objectives: the multiplier is "
            "not comparable with published full-attention values."
            if windowed
            else ""
        )
    )
    analysis = multiplier_analysis(runs, unigram, settings)
    ar_l = likelihood["ar"]["estimates"]["nll"]
    mdm_l = likelihood["mdm"]["estimates"]["nelbo"]
    ratio = math.exp(mdm_l["nats_per_token"] - ar_l["nats_per_token"])
    exact_bytes = likelihood["ar"]["protocol"]["tokenizer"].get("bytes_exact", True)
    byte_note = "" if exact_bytes else " (approximate: the tokenizer normalizes text)"
    ar_set, mdm_set = headline_sets(settings)
    judged = {name: judge_text(quality["sets"][name]) for name in (ar_set, mdm_set)}
    gap = analysis["final_gap"]
    report.text(
        f"**Likelihood.** On the same {ar_l['tokens']:,} validation tokens the AR model of seed "
        f"{settings.seeds[0]} scores "
        f"{ar_l['bits_per_byte']:.4f} bits/byte{byte_note} (exact NLL) and the MDM at most "
        f"{mdm_l['bits_per_byte']:.4f} (NELBO, 95% interval of the per-token value "
        f"[{mdm_l['nats_per_token_ci95'][0]:.4f}, {mdm_l['nats_per_token_ci95'][1]:.4f}] nats): "
        f"an MDM/AR perplexity ratio of at most **{ratio:.2f}** after "
        f"{summaries['ar']['tokens_seen']:,} training tokens each{schedule_note(summaries)} "
        "(published: about 1.2-1.3 at large compute, larger at small compute). Over "
        f"{len(settings.seeds)} training seed(s) the paired MDM - AR difference at the main "
        f"budget is {gap['text']} nats/token (one fixed noise draw per row).\n\n"
        f"**Samples.** The judge ({quality['judge']}) gives AR samples at temperature 1 a "
        f"perplexity of {judged[ar_set]} and the MDM's ({mdm_set}) {judged[mdm_set]} (95% "
        "intervals over the samples, of the first seed's models); held-out text scores "
        f"{quality['reference']['judge_ppl']:.1f}. The frontier below shows what each diffusion "
        "sampler buys per network evaluation. Wall time of this invocation: "
        f"{wall_seconds / 60:.1f} min"
        + (
            f" (reused from an earlier run: {', '.join(reused)})."
            if reused
            else ", every stage computed."
        )
    )
    trained = {name: train_config(main / name) for name in summaries}
    schedules = "; ".join(
        f"{name.upper()} warmup {cfg['warmup_steps']} steps, peak learning rate {cfg['lr']:g}"
        for name, cfg in trained.items()
    )
    cooldown = trained["ar"]["cooldown_fraction"]
    schedules += (
        f"; each budget cools down over its last {cooldown:.0%} of steps, linearly to "
        f"{trained['ar']['min_lr_ratio']:g}x"
    )
    curves = budgets_section(report, runs, analysis, unigram, windowed, schedules)
    curves["attention"] = attention
    tuning_section(report, tuning)
    sources = {name: sampling_checkpoint(main / name)[1] for name in ("ar", "mdm")}
    if any(label != "final checkpoint" for label in sources.values()):
        report.text(
            "**Samples come from:** "
            + "; ".join(f"{name.upper()}: {label}" for name, label in sources.items())
            + "."
        )
    curves["sampling_checkpoints"] = sources
    rows = {
        "AR": ar_l | {"protocol": likelihood["ar"]["protocol"]},
        "MDM": mdm_l | {"protocol": likelihood["mdm"]["protocol"]},
    }
    if "chain_rule_nll" in likelihood["mdm"]["estimates"]:
        chain = likelihood["mdm"]["estimates"]["chain_rule_nll"]
        rows[f"MDM left-to-right (first {settings.chain_rule_rows} rows)"] = chain | {
            "protocol": likelihood["mdm"]["protocol"]
        }
        rows[f"MDM NELBO (same {settings.chain_rule_rows} rows)"] = likelihood["mdm"]["estimates"][
            "nelbo_on_chain_rule_rows"
        ] | {"protocol": likelihood["mdm"]["protocol"]}
    report.likelihood_table("Validation likelihood (same rows, same protocol)", rows)
    # One peak for both rows: the start-up matmul measurement is noisy on a shared machine.
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
            f"fraction) against one peak of {peak / 1e12:.3g} TFLOP/s for both rows "
            f"({summaries['ar']['peak_flops_source']}); FLOPs by the config count "
            "(6N + attention), the same formula for both objectives.",
        )
    )
    quality_rows = []
    for name, entry in sets.items():
        q = quality["sets"][name]
        quality_rows.append(
            [
                name,
                entry["nfe"],
                entry["nfe_per_token"],
                entry["flops_per_token"],
                entry["tokens_per_s"],
                entry["seconds"] / entry["samples"],
                q["judge_ppl"],
                q["unigram_entropy"],
                q["distinct_2"],
                q["repetition_rate_4gram"],
                q.get("mauve", "-"),
            ]
        )
    quality_rows.append(
        [
            "held-out text",
            "-",
            "-",
            "-",
            "-",
            "-",
            quality["reference"]["judge_ppl"],
            "-",
            quality["reference"]["distinct_2"],
            quality["reference"]["repetition_rate_4gram"],
            "-",
        ]
    )
    report.table(
        Table(
            f"Generation: unconditional samples x {settings.gen_length} tokens "
            f"({settings.samples} per setting, {max(settings.samples, settings.headline_samples)} "
            "for the headline settings)",
            [
                "setting",
                "NFE",
                "NFE/token",
                "FLOPs/token",
                "tokens/s",
                "s/sample",
                "judge ppl",
                "unigram entropy",
                "distinct-2",
                "4-gram repetition",
                "MAUVE",
            ],
            quality_rows,
            note=f"Judge: {quality['judge']}. Entropy is per sample over model token ids; MAUVE "
            "against held-out text of the same length (few samples: a noisy number).",
        )
    )
    nfe_curves: dict[str, list[tuple[float, float]]] = {}
    entropy_curves: dict[str, list[tuple[float, float]]] = {}
    for name, entry in sets.items():
        q = quality["sets"][name]
        if entry["objective"] == "unigram":
            continue  # a floor, not a sampler: it is in the table
        if entry["temperature"] == 1.0:
            label = "AR (KV cache)" if entry["objective"] == "ar" else f"MDM {entry['sampler']}"
            nfe_curves.setdefault(label, []).append((entry["nfe"], q["judge_ppl"]))
        if (
            entry["objective"] == "ar"
            or entry["sampler"] == "ancestral"
            and (entry["steps"] == settings.diffusion_steps[len(settings.diffusion_steps) // 2])
        ):
            label = "AR" if entry["objective"] == "ar" else "MDM ancestral"
            entropy_curves.setdefault(label, []).append((q["unigram_entropy"], q["judge_ppl"]))
    report.plot(
        "frontier_nfe",
        frontier_figure(
            nfe_curves,
            xlabel="network evaluations per batch (NFE)",
            ylabel="judge perplexity",
            title="Quality vs inference compute",
            logx=True,
        ),
        "Judge perplexity vs NFE",
    )
    report.plot(
        "frontier_entropy",
        frontier_figure(
            entropy_curves,
            xlabel="unigram entropy (nats)",
            ylabel="judge perplexity",
            title="Quality vs diversity (temperature sweep)",
        ),
        "Judge perplexity vs entropy under a temperature sweep",
    )
    lines = ["### Same prompts, both models", ""]
    for item in examples["side_by_side"]:
        lines += [
            f"- **prompt**: {item['prompt']!r}",
            f"  - **AR**: {item['ar']!r}",
            f"  - **MDM**: {item['mdm']!r}",
        ]
    infill = examples["infill"]
    lines += [
        "",
        f"AR: {examples['ar_seconds_per_sample']:.2f} s/sample ({examples['ar_nfe']} forwards "
        f"per batch); MDM ancestral {examples['mdm_steps']} steps: "
        f"{examples['mdm_seconds_per_sample']:.2f} s/sample ({examples['mdm_nfe']} NFE).",
        "",
        "### Infilling (only the MDM can condition on a suffix)",
        "",
        f"- prefix: {infill['prefix']!r}",
        f"- suffix: {infill['suffix']!r}",
        f"- original middle: {infill['original_middle']!r}",
        f"- **MDM middle** (sees prefix and suffix): {infill['mdm_middle']!r}",
        f"- AR continuation (prefix only): {infill['ar_prefix_only']!r}",
    ]
    report.text("\n".join(lines))
    report.results.update(
        {
            "likelihood_raw": likelihood,
            "generation": {
                k: {key: v for key, v in e.items() if key not in ("ids",)} for k, e in sets.items()
            },
            "quality": quality,
            "examples": examples,
            "training": summaries,
            "mdm_ar_perplexity_ratio": ratio,
            "budgets": curves,
            "tuning": tuning,
            "wall_seconds": wall_seconds,
        }
    )
    return report.write()


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
