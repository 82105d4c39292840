"""What the comparison's report is written from (``ReportInputs``), and its sections on the
samples: the generation table, the judge-perplexity frontiers and the examples."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.experiments.compare_budgets import attention_pattern, family_analyses, seed_folder
from eval.experiments.compare_settings import CompareSettings, diffusion_families
from eval.report import Report, Table, frontier_figure
from shared.door import read_json_file


def model_config(run_dir: Path) -> dict[str, Any]:
    return read_json_file(run_dir / "config.json")["model_config"]


def train_config(run_dir: Path) -> dict[str, Any]:
    return read_json_file(run_dir / "config.json")["train_config"]


@dataclass
class ReportInputs:
    """What the report is written from: the trained runs, the stage results and the settings,
    and what follows from them (the first seed's runs, their attention, the M(L) analysis)."""

    out: Path
    preset: str
    runs: dict[int, dict[str, Any]]
    likelihood: dict[str, Any]
    sets: dict[str, Any]
    quality: dict[str, Any]
    examples: dict[str, Any]
    settings: CompareSettings
    wall_seconds: float
    reused: list[str]
    unigram: float
    tuning: dict[str, Any] | None
    throughput: dict[str, Any] | None = None  # the fair timing of every setting (compare_speed)
    # every seed's sample sets, their judged quality and timing (seed -> "sets", "quality",
    # "throughput"); None: the first seed's alone (the fields above)
    per_seed: dict[int, dict[str, Any]] | None = None
    # where the report goes when not beside the trained runs (another generation length's)
    evaluation: Path | None = None
    main: Path = field(init=False)
    summaries: dict[str, dict[str, Any]] = field(init=False)
    analysis: dict[str, Any] = field(init=False)
    analyses: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.main = seed_folder(self.out, self.settings.seeds[0])
        self.summaries = self.runs[self.settings.seeds[0]]["summaries"]
        self.analyses = family_analyses(self.runs, self.unigram, self.settings)
        # the first diffusion family's: the headline multiplier (the MDM's by default)
        self.analysis = self.analyses[self.families[0]]

    @property
    def families(self) -> tuple[str, ...]:
        return diffusion_families(self.settings)

    @property
    def attention(self) -> dict[str, str]:
        """How each model attends, in words."""
        return {
            name: attention_pattern(
                summary["objective"], model_config(self.main / name).get("sliding_window", 0)
            )
            for name, summary in self.summaries.items()
        }

    @property
    def windowed(self) -> bool:
        return any(
            model_config(self.main / name).get("sliding_window", 0) for name in self.summaries
        )


# A section adds its text, tables and plots to the report and returns what report.json keeps of
# it; ``write_report`` runs them in the report's order.
Section = Callable[[Report, ReportInputs], dict[str, Any]]


def generation_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """One row per sample set (cost and quality), and held-out text as the reference row."""
    settings, sets, quality = inputs.settings, inputs.sets, inputs.quality
    rows = [generation_row(name, entry, quality["sets"][name]) for name, entry in sets.items()]
    reference = quality["reference"]
    rows.append(
        ["held-out text", "-", "-", "-", "-", "-", reference["judge_ppl"], "-"]
        + [reference["distinct_2"], reference["repetition_rate_4gram"], "-"]
    )
    report.table(
        Table(
            f"Generation: unconditional samples x {settings.gen_length} tokens "
            f"({settings.samples} per setting, {max(settings.samples, settings.headline_samples)} "
            "for the headline settings)",
            GENERATION_COLUMNS,
            rows,
            note=f"Judge: {quality['judge']}. Entropy is per sample over model token ids; MAUVE "
            "against held-out text of the same length (few samples: a noisy number).",
        )
    )
    generation = {
        k: {key: v for key, v in e.items() if key not in ("ids",)} for k, e in sets.items()
    }
    return {"generation": generation, "quality": quality}


def generation_row(name: str, entry: dict[str, Any], judged: dict[str, Any]) -> list[Any]:
    return [
        name,
        entry["nfe"],
        entry["nfe_per_token"],
        entry["flops_per_token"],
        entry["tokens_per_s"],
        entry["seconds"] / entry["samples"],
        judged["judge_ppl"],
        judged["unigram_entropy"],
        judged["distinct_2"],
        judged["repetition_rate_4gram"],
        judged.get("mauve", "-"),
    ]


GENERATION_COLUMNS = [
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
]


def frontier_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """Judge perplexity against NFE (every sampler at T=1) and against entropy (the
    temperature sweeps)."""
    middle = inputs.settings.diffusion_steps[len(inputs.settings.diffusion_steps) // 2]
    nfe_curves: dict[str, list[tuple[float, float]]] = {}
    entropy_curves: dict[str, list[tuple[float, float]]] = {}
    for name, entry in inputs.sets.items():
        judged = inputs.quality["sets"][name]
        if entry["objective"] == "unigram":
            continue  # a floor, not a sampler: it is in the table
        if entry["temperature"] == 1.0:
            family = entry["objective"].upper()
            label = "AR (KV cache)" if family == "AR" else f"{family} {entry['sampler']}"
            nfe_curves.setdefault(label, []).append((entry["nfe"], judged["judge_ppl"]))
        if entry["objective"] == "ar" or (
            entry["sampler"] == "ancestral" and entry["steps"] == middle
        ):
            label = (
                "AR" if entry["objective"] == "ar" else f"{entry['objective'].upper()} ancestral"
            )
            point = (judged["unigram_entropy"], judged["judge_ppl"])
            entropy_curves.setdefault(label, []).append(point)
    frontier_plot(
        report,
        "frontier_nfe",
        nfe_curves,
        ("network evaluations per batch (NFE)", "Quality vs inference compute", True),
        "Judge perplexity vs NFE",
    )
    frontier_plot(
        report,
        "frontier_entropy",
        entropy_curves,
        ("unigram entropy (nats)", "Quality vs diversity (temperature sweep)", False),
        "Judge perplexity vs entropy under a temperature sweep",
    )
    return {}


def frontier_plot(
    report: Report,
    name: str,
    curves: dict[str, list[tuple[float, float]]],
    axes: tuple[str, str, bool],
    caption: str,
) -> None:
    """One judge-perplexity frontier: ``axes`` is (x label, title, log x)."""
    xlabel, title, logx = axes
    figure = frontier_figure(
        curves, xlabel=xlabel, ylabel="judge perplexity", title=title, logx=logx
    )
    report.plot(name, figure, caption)


def examples_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """The same prompts through every model, and the infilling example of each diffusion
    family."""
    examples, families = inputs.examples, inputs.families
    lines = [f"### Same prompts, {every(inputs.settings.objectives)} models", ""]
    for item in examples["side_by_side"]:
        lines += [f"- **prompt**: {item['prompt']!r}", f"  - **AR**: {item['ar']!r}"]
        lines += [f"  - **{name.upper()}**: {item[name]!r}" for name in families]
    infill = examples["infill"]
    costs = [
        f"{name.upper()} ancestral {examples[f'{name}_steps']} steps: "
        f"{examples[f'{name}_seconds_per_sample']:.2f} s/sample ({examples[f'{name}_nfe']} NFE)"
        for name in families
    ]
    lines += [
        "",
        f"AR: {examples['ar_seconds_per_sample']:.2f} s/sample ({examples['ar_nfe']} forwards "
        "per batch); " + "; ".join(costs) + ".",
    ]
    infilled = [name for name in families if f"{name}_middle" in infill]
    if infilled:
        who = " and ".join(f"the {name.upper()}" for name in infilled)
        lines += [
            "",
            f"### Infilling (only {who} can condition on a suffix)",
            "",
            f"- prefix: {infill['prefix']!r}",
            f"- suffix: {infill['suffix']!r}",
            f"- original middle: {infill['original_middle']!r}",
        ]
        lines += [
            f"- **{name.upper()} middle** (sees prefix and suffix): {infill[f'{name}_middle']!r}"
            for name in infilled
        ]
        lines.append(f"- AR continuation (prefix only): {infill['ar_prefix_only']!r}")
    report.text("\n".join(lines))
    return {"examples": examples, "wall_seconds": inputs.wall_seconds}


def every(objectives: tuple[str, ...]) -> str:
    """ "both" for two objectives, "all N" for more."""
    return "both" if len(objectives) == 2 else f"all {len(objectives)}"
