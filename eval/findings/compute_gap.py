"""Finding: at equal compute on fresh data the AR model is ahead, and the masked diffusion model
needs about 16x the compute to reach the same validation loss (SMDM), measured at several model
sizes with the main job's budget points and multiplier (``eval.experiments.compare_budgets``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eval.budgets import HEADLINE_RULES
from eval.curves import entropy_of_counts
from eval.experiments.compare import token_frequencies
from eval.experiments.compare_budgets import (
    attention_pattern,
    multiplier_analysis,
    own_settings,
    seed_folder,
    train_budget_points,
)
from eval.experiments.compare_curves import PUBLISHED_MULTIPLIER, frontier_figure
from eval.experiments.compare_settings import COMPARE_PRESETS, CompareSettings
from eval.experiments.stages import Stages, load
from eval.findings.common import (
    Claim,
    Finding,
    FindingResult,
    Job,
    finish_report,
    rule_text,
    start_report,
)
from eval.findings.verdicts import (
    INCONCLUSIVE,
    Band,
    Interval,
    LearnedCheck,
    direction_verdict,
    magnitude_verdict,
)
from eval.report import Table
from shared.door import read_json_file

CLAIM = Claim(
    "Compute gap on fresh data",
    f"At equal compute and fresh data the AR model is ahead; the MDM needs about "
    f"{PUBLISHED_MULTIPLIER:.0f}x the compute to match its validation loss.",
    "Nie et al. 2024 (SMDM)",
)


@dataclass(frozen=True)
class GapSettings:
    preset: str
    sizes: tuple[dict[str, int], ...]  # model-shape overrides, smallest first
    overrides: dict[str, Any] = field(default_factory=dict)
    fresh_epochs: float = 1.0  # budget points past this many epochs are not "fresh data"
    # the budget points, seeds and headline rule: the main job's (eval.experiments.compare_budgets)
    budgets: CompareSettings = field(default_factory=CompareSettings)

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.budgets.seeds


SETTINGS = {
    "smoke": GapSettings(
        "smoke",
        (dict(dim=32, hidden_dim=96), dict(dim=64, hidden_dim=160)),
        dict(max_steps=60, eval_every=60),
        budgets=CompareSettings(ar_budgets=(1 / 2,), mdm_budgets=(1 / 2,)),
    ),
    # The main job's own budget points (the demo preset at 320 steps, 0.78 epochs of KJV: fresh
    # data), 3 seeds: 7 AR and 5 MDM budgets, each scheduled for its own length. The demo's
    # attention is windowed (8 tokens), which the MDM needs to leave its unigram plateau within
    # a CPU budget (docs/studies/demo-budgets.md): the report says so first, and no verdict on
    # SMDM's full-attention claim is drawn from it.
    "cpu": GapSettings(
        "demo",
        (dict(dim=128, hidden_dim=352),),
        budgets=replace(COMPARE_PRESETS["demo"], seeds=(0, 1, 2)),
    ),
    # GPT-2-small family on OpenWebText at three widths (fresh data throughout).
    "gpu": GapSettings(
        "owt-small",
        (
            dict(dim=384, n_layers=6, n_heads=6, n_kv_heads=6, hidden_dim=1536),
            dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, hidden_dim=2048),
            dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, hidden_dim=3072),
        ),
        dict(max_steps=20000),
        budgets=CompareSettings(
            seeds=(0, 1, 2),
            ar_budgets=(1 / 16, 1 / 8, 1 / 4, 1 / 2),
            mdm_budgets=(1 / 8, 1 / 4, 1 / 2, 3 / 4),
        ),
    ),
}


def size_label(size: dict[str, int]) -> str:
    return "d{}".format(size["dim"]) + (f"-l{size['n_layers']}" if "n_layers" in size else "")


# Declared before any run (hashed into the registration): the values counted as SMDM's ~16x (a
# factor of two either way), and the budget points each model needs past its plateau, in every
# seed, to read M from its frontier.
BAND = Band(PUBLISHED_MULTIPLIER, 8.0, 32.0)
RULE = {
    "band": [BAND.low, BAND.high],
    "min_points_past_plateau": 2,
    "windowed_attention": "inconclusive: not comparable with SMDM's full attention",
}


def runs(settings: GapSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every trunk this finding trains (for the registration; its budget branches are these
    runs cut short at the budgets ``settings.budgets`` declares)."""
    schedule = {"lr_schedule": "wsd", "cooldown_fraction": settings.budgets.cooldown_fraction}
    warmups = own_settings(settings.budgets)
    return {
        f"{size_label(size)}/seed-{seed}/{objective}": (
            settings.preset,
            settings.overrides
            | size
            | schedule
            | {"seed": seed, "objective": objective}
            | warmups.get(objective, {}),
        )
        for size in settings.sizes
        for seed in settings.seeds
        for objective in ("ar", "mdm")
    }


def run(settings: GapSettings, job: Job) -> FindingResult:
    out, force, scale = job.out, job.force, job.scale
    stages = Stages(out, force, job.stop)
    measured = []
    for size in settings.sizes:
        folder = out / size_label(size)
        overrides = settings.overrides | size | job.extra
        runs = train_budget_points(
            settings.preset, folder, overrides, settings.budgets, "tokens", force
        )
        main = seed_folder(folder, settings.seeds[0])
        key = {
            "size": size,
            "steps": {k: v["step"] for k, v in runs[settings.seeds[0]]["summaries"].items()},
        }
        unigram = stages.run(
            f"unigram-{size_label(size)}",
            key,
            lambda f=main: entropy_of_counts(token_frequencies(*load(f, "ar")[1:])),
        )
        window = read_json_file(main / "ar" / "config.json")["model_config"]
        measured.append(
            measure_size(runs, size, unigram, settings)
            | {"window": int(window.get("sliding_window") or 0)}
        )
    return judge(scale, settings, measured, out)


def measure_size(
    runs: dict[int, dict[str, Any]], size: dict[str, int], unigram: float, settings: GapSettings
) -> dict[str, Any]:
    """The main job's multiplier analysis over the budget points on fresh data."""
    fresh = {
        seed: run
        | {
            "points": {
                name: [p for p in points if p["epochs"] <= settings.fresh_epochs]
                for name, points in run["points"].items()
            }
        }
        for seed, run in runs.items()
    }
    analysis = multiplier_analysis(fresh, unigram, settings.budgets)
    spread = analysis["multiplier"]
    interval = None
    if spread is not None and spread["low"] is not None:
        interval = Interval(spread["mean"], spread["low"], spread["high"])
    first = runs[settings.seeds[0]]["summaries"]["ar"]
    return {
        "size": size,
        "parameters": first["parameters"],
        "unigram": unigram,
        "epochs_seen": first["epochs_seen"],
        "past_plateau": {seed: s["past_plateau"] for seed, s in analysis["seeds"].items()},
        "analysis": analysis,
        "interval": None if interval is None else interval.as_dict(),
        "points": {seed: {"points": run["points"]} for seed, run in fresh.items()},
    }


def rules(settings: GapSettings) -> list[str]:
    """The rules the report states before its numbers."""
    return rule_text("seeds", "learned", "magnitude") + [
        "Here the multiplier is the main job's (shared code, `eval.experiments."
        "compare_budgets`): each objective trained at several budgets, each a run scheduled "
        "for its own length (WSD cooldown branches of one trunk, each budget with its own "
        "warmup and decay), validated at its end; only points more than "
        f"{settings.budgets.plateau_margin} nats below the unigram entropy and within "
        f"{settings.fresh_epochs:g} epoch of the training data (fresh data) enter. M is read "
        f"at {HEADLINE_RULES[settings.budgets.headline_rule]} (the declared loss level), per "
        "seed; its interval is the t interval of log M over the seeds. The band is "
        f"{BAND.text()}. The verdict is the largest size's, and needs M read in every seed "
        "(otherwise *inconclusive*). Learned checks: each model has "
        f"at least {RULE['min_points_past_plateau']} budget points past its plateau in "
        "every seed (a frontier to read M from)."
    ]


def attention_preface(patterns: dict[str, str], window: int) -> str:
    return f"**Attention.** AR: {patterns['ar']}; MDM: {patterns['mdm']}." + (
        " Windowed attention: these multipliers are **not comparable** with SMDM's "
        "(full attention), and the verdict is *inconclusive* whatever they are."
        if window
        else ""
    )


def size_row(m: dict[str, Any]) -> tuple[list[Any], tuple[str, str, Interval | None]]:
    """One model size's row of the multiplier table and its (direction, magnitude, interval)."""
    interval = None if m["interval"] is None else Interval(**m["interval"])
    direction = direction_verdict(Interval(1.0, 1.0, 1.0), interval)
    magnitude = magnitude_verdict(BAND, interval)
    analysis = m["analysis"]
    exponents = analysis["exponents"]
    row = [
        size_label(m["size"]),
        m["parameters"],
        "; ".join(
            f"seed {seed}: AR {c['ar']}, MDM {c['mdm']}" for seed, c in m["past_plateau"].items()
        ),
        "not measured" if interval is None else interval.text(3),
        _spread_text(analysis.get("fitted_multiplier")),
        f"AR {_spread_text(exponents.get('ar'))}; MDM {_spread_text(exponents.get('mdm'))}",
        direction,
        magnitude,
    ]
    return row, (direction, magnitude, interval)


def sizes_table(rows: list[list[Any]]) -> Table:
    return Table(
        "Compute multiplier per model size",
        [
            "size",
            "parameters",
            "budget points past the plateau (fresh data)",
            "M at the declared level (95%)",
            "M from the two log-log fits",
            "exponents alpha (loss ~ C^-alpha)",
            "AR ahead?",
            f"M in {BAND.low:g}-{BAND.high:g}x?",
        ],
        rows,
    )


def largest_verdict(
    largest: dict[str, Any], magnitude: str, interval: Interval | None, window: int
) -> tuple[str, list[str]]:
    """The verdict at the largest size: the band's, unless M is missing there (in any seed) or
    the attention is windowed; with the notes that say why."""
    notes = []
    if interval is None:
        notes.append(
            "No multiplier interval at the largest size: fewer than two seeds where both "
            "frontiers, past the plateau on fresh data, cover the declared loss level."
        )
    missing = largest["analysis"].get("unmeasured_seeds", [])
    if interval is not None and missing:
        notes.append(
            f"M was not read in seed(s) {missing} at the largest size (a frontier past the "
            "plateau on fresh data does not reach the declared loss level): the interval of the "
            "other seeds would hide them, so the verdict is *inconclusive*."
        )
    verdict = magnitude if interval is not None and not missing else INCONCLUSIVE
    if window and verdict != INCONCLUSIVE:
        notes.append(
            f"With full attention the band would give *{verdict}*; with windowed attention the "
            "verdict is *inconclusive* (not comparable with SMDM)."
        )
        verdict = INCONCLUSIVE
    return verdict, notes


def learned_checks(largest: dict[str, Any]) -> list[LearnedCheck]:
    """Each model's budget points past its plateau at the largest size, in every seed."""
    least = RULE["min_points_past_plateau"]
    return [
        LearnedCheck(
            name.upper(),
            f"at least {least} budget points past the plateau in every seed",
            ", ".join(f"seed {seed}: {c[name]}" for seed, c in largest["past_plateau"].items()),
            all(c[name] >= least for c in largest["past_plateau"].values()),
        )
        for name in ("ar", "mdm")
    ]


def judge(scale: str, settings: GapSettings, measured: list[dict], out: Path) -> FindingResult:
    largest = measured[-1]
    window = largest.get("window", 0)
    patterns = {o: attention_pattern(o, window) for o in ("ar", "mdm")}
    preface = attention_preface(patterns, window)
    report = start_report(FINDING, scale, out, settings, rules(settings), preface=preface)
    rows, verdicts = [], []
    for m in measured:
        row, verdict = size_row(m)
        rows.append(row)
        verdicts.append(verdict)
        label = size_label(m["size"])
        figure = frontier_figure(m["points"], m["unigram"])
        report.plot(f"budgets_{label}", figure, f"Budget frontiers at {label}")
    report.table(sizes_table(rows))
    report.table(multiplier_curve_table(largest))
    _, magnitude, interval = verdicts[-1]
    verdict, notes = largest_verdict(largest, magnitude, interval, window)
    return finish_report(
        report,
        FINDING,
        scale,
        measured=("windowed attention, not comparable with SMDM: " if window else "")
        + "multiplier "
        + "; ".join(
            f"{size_label(m['size'])}: " + ("not measured" if v[2] is None else f"{v[2].text(3)}x")
            for m, v in zip(measured, verdicts)
        ),
        verdict=verdict,
        rule=f"the whole 95% interval at the largest size inside {BAND.text()}; windowed "
        "attention is inconclusive",
        checks=learned_checks(largest),
        numbers={
            "sizes": [{k: v for k, v in m.items() if k != "points"} for m in measured],
            "points": {size_label(m["size"]): m["points"] for m in measured},
            "direction_verdicts": [v[0] for v in verdicts],
            "magnitude_verdicts": [v[1] for v in verdicts],
            "attention": patterns,
        },
        notes=notes,
    )


def _spread_text(spread: dict[str, Any] | None) -> str:
    return "not measured" if not spread else spread["text"]


def multiplier_curve_table(size: dict[str, Any]) -> Table:
    """M(L) over the loss range both frontiers cover, per seed."""
    rows = []
    for seed, per in size["analysis"]["seeds"].items():
        for loss, multiplier in per["curve"]:
            rows.append([seed, loss, multiplier])
    return Table(
        f"M(L) at {size_label(size['size'])}, per seed",
        ["seed", "validation loss L (nats/token)", "M(L) = C_MDM(L) / C_AR(L)"],
        rows,
        note="Read by log-log interpolation on each frontier, only inside the loss range both "
        "cover (no extrapolation).",
    )


FINDING = Finding(
    "compute-gap",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 7.5 GPU-hours per seed (3 sizes x 2 objectives x 20k steps of 512 x 1024 "
    "tokens, plus the budget branches' cooldowns)",
    rule=RULE,
    gpu_budget="GPT-2-small shapes at three widths on OpenWebText, full attention, 20k steps",
    cost="3 seeds x (2 trunks of 320 steps + 9 cooldown branches)",
    runs=runs,
    judged_by=("eval.budgets", "eval.experiments.compare_budgets"),
)
