"""Finding: in data-constrained training (a fixed set of unique tokens repeated for many epochs)
the AR model's validation loss bottoms out after a few epochs and rises, while the masked
diffusion model keeps improving, and with enough compute ends below the AR's best.

The unique tokens are whole rows drawn uniformly over the training split (a fixed seed shared by
every run); every validation is on the whole held-out split. The AR baseline gets a small
weight-decay sweep (its best run counts) and its own cosine schedule over ~16 epochs; the MDM a
constant rate after warmup for >= 150 epochs. The AR's data-reuse half-life R* (Muennighoff et al.
2023) is fitted against a fresh-data AR run on the same schedule."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.curves import entropy_of_counts
from eval.experiments.compare import token_frequencies
from eval.experiments.compare_curves import eval_records
from eval.experiments.stages import Stages, load, train_or_reuse
from eval.findings.common import (
    Claim,
    Finding,
    FindingResult,
    Job,
    finish_report,
    rule_text,
    start_report,
)
from eval.findings.reuse_half_life import best_point, effective_epochs, fit_half_life
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    LearnedCheck,
    direction_verdict,
    paired_difference,
    seed_interval,
)
from eval.report import Report, Table
from shared.door import read_json_file
from shared.training import resolve_config

CLAIM = Claim(
    "Data-constrained crossover",
    "Repeating a fixed set of unique tokens, AR stops improving after ~4 epochs and then "
    "overfits, while the MDM keeps improving (data-reuse half-life ~15 epochs for AR vs ~500 "
    "for diffusion); with enough compute the MDM's validation loss ends below the AR's best.",
    "Prabhudesai et al. 2025; Ni et al. 2025",
)


@dataclass(frozen=True)
class DataSettings:
    seeds: tuple[int, ...]
    preset: str
    unique_tokens: int
    ar_epochs: float
    mdm_epochs: float
    weight_decays: tuple[float, ...]  # the AR's sweep; its best run is the baseline
    ar_evals_per_epoch: float
    mdm_evals_per_epoch: float
    ar_warmup_steps: int
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": DataSettings(
        (0, 1), "smoke", 2048, 4, 8, (0.1, 1.0), 1, 0.5, 2, dict(eval_batches=2, batch_size=8)
    ),
    # The demo model on 16k unique KJV tokens (130 rows drawn over the whole split), batch 16
    # (8 steps an epoch): AR 16 epochs at weight decay 0.1, 0.3 and 1.0, validated once an
    # epoch; MDM 150 epochs, validated every 5; every validation on the whole held-out split.
    "cpu": DataSettings(
        (0, 1, 2),
        "demo",
        16384,
        16,
        150,
        (0.1, 0.3, 1.0),
        1,
        0.2,
        10,
        dict(batch_size=16, eval_batches=0),
    ),
    # GPT-2 small on 25M unique tokens of OpenWebText: AR 16 epochs, MDM 200.
    "gpu": DataSettings(
        (0, 1, 2),
        "owt-small",
        25_000_000,
        16,
        200,
        (0.1, 0.3, 1.0),
        1,
        0.1,
        500,
        dict(eval_batches=20),
    ),
}
# Declared before any run (hashed into the registration).
RULE = {
    # the MDM has plateaued when its mean validation over the last fifth of its validations is
    # less than plateau_drop nats below the mean over the fifth before
    "plateau_window": 0.2,
    "plateau_drop": 0.01,
    # a model learned when its best validation is this many nats below the unigram entropy
    "learned_margin": 0.1,
}


def ar_name(weight_decay: float) -> str:
    return f"ar-wd{weight_decay:g}"


def unique_rows(settings: DataSettings) -> tuple[int, int]:
    """(rows of unique tokens, batch size) of the preset with the settings' overrides."""
    _, base = resolve_config(settings.preset, settings.overrides)
    return math.ceil(settings.unique_tokens / (base.seq_len - 1)), base.batch_size


def seed_plan(settings: DataSettings, seed: int) -> dict[str, dict[str, Any]]:
    """One seed's runs, each with its objective: the AR sweep and the MDM on the repeated rows,
    and the fresh-data AR on the first AR run's schedule (its step count, the first AR run's
    last step, is set when that run has finished)."""
    rows, batch_size = unique_rows(settings)

    def every(evals_per_epoch: float) -> int:
        return max(1, round(rows / batch_size / evals_per_epoch))

    shared = settings.overrides | {"curve_points": 0, "seed": seed}
    repeated = shared | {"unique_tokens": settings.unique_tokens, "unique_sample": "random"}
    ar = {
        "warmup_steps": settings.ar_warmup_steps,
        "eval_every": every(settings.ar_evals_per_epoch),
    }
    plan = {
        ar_name(wd): repeated | ar | {"epochs": settings.ar_epochs, "weight_decay": wd}
        for wd in settings.weight_decays
    }
    plan = {name: over | {"objective": "ar"} for name, over in plan.items()}
    plan["mdm"] = repeated | {
        "epochs": settings.mdm_epochs,
        "lr_schedule": "constant",
        "eval_every": every(settings.mdm_evals_per_epoch),
        "objective": "mdm",
    }
    plan["ar-fresh"] = shared | ar | {"weight_decay": settings.weight_decays[0], "objective": "ar"}
    return plan


def runs(settings: DataSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration)."""
    return {
        f"seed{seed}/{name}": (settings.preset, over)
        for seed in settings.seeds
        for name, over in seed_plan(settings, seed).items()
    }


def run(settings: DataSettings, job: Job) -> FindingResult:
    rows, _ = unique_rows(settings)
    curves_by_seed: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for seed in settings.seeds:
        curves_by_seed[seed] = train_seed(settings, job, seed, rows)
    first_seed = job.out / f"seed{settings.seeds[0]}" / ar_name(settings.weight_decays[0])
    stages = Stages(job.out, job.force, job.stop)
    unigram = stages.run(
        "unigram",
        {},
        lambda: entropy_of_counts(token_frequencies(*load(first_seed.parent, first_seed.name)[1:])),
    )
    return judge(job.scale, settings, curves_by_seed, unigram, job.out)


def train_seed(
    settings: DataSettings, job: Job, seed: int, rows: int
) -> dict[str, list[dict[str, Any]]]:
    """One seed's runs trained (or reused), as validation curves over epochs of the unique rows
    (the fresh run's: tokens / unique tokens)."""
    folder = job.out / f"seed{seed}"
    plan = seed_plan(settings, seed)
    first = ar_name(settings.weight_decays[0])
    curves = {
        name: train_planned(name, folder / name, settings.preset, plan[name], job)
        for name in [*map(ar_name, settings.weight_decays), "mdm"]
    }
    plan["ar-fresh"]["max_steps"] = curves[first][-1]["step"]
    curves["ar-fresh"] = train_planned(
        "ar, fresh data", folder / "ar-fresh", settings.preset, plan["ar-fresh"], job, rows
    )
    return curves


def train_planned(
    label: str, run_dir: Path, preset: str, planned: dict, job: Job, rows: int | None = None
) -> list[dict[str, Any]]:
    start = {"objective": planned["objective"]}
    over = {k: v for k, v in planned.items() if k != "objective"} | job.extra
    summary = train_or_reuse(label, run_dir, preset, start, over, job.force)
    return read_periodic(run_dir, rows or summary["train_rows"])


def read_periodic(run_dir: Path, unique_rows: int) -> list[dict[str, Any]]:
    """The run's validations on the whole held-out split (the same rows and noise each time),
    with the epoch of the unique rows each was taken at."""
    records = eval_records(run_dir)
    size = Counter(r["val_tokens"] for r in records).most_common(1)[0][0]
    config = read_json_file(run_dir / "config.json")["train_config"]
    by_step = {r["step"]: r for r in records if r["val_tokens"] == size}
    return [
        by_step[step] | {"epoch": step * config["batch_size"] / unique_rows}
        for step in sorted(by_step)
    ]


def plateaued(curve: list[dict[str, Any]]) -> bool:
    """Whether the run stopped improving: its mean validation over the last RULE["plateau_window"]
    of its validations is less than RULE["plateau_drop"] nats below the mean over the window
    before (a cosine decay's last-quarter minimum does not count as improving)."""
    width = max(1, round(len(curve) * RULE["plateau_window"]))
    if len(curve) < 2 * width:
        return False
    losses = [r["val_nats_per_token"] for r in curve]
    last = sum(losses[-width:]) / width
    before = sum(losses[-2 * width : -width]) / width
    return last > before - RULE["plateau_drop"]


def data_verdict(difference: Interval, mdm_plateaued: bool) -> str:
    """The headline on the paired difference MDM best - AR best over seeds. Reproduced: the
    whole interval below 0. Not reproduced: the whole interval above 0 with the MDM plateaued
    in every seed (more compute would not change it). Inconclusive otherwise, including above
    but still improving (short of the claim's 'enough compute')."""
    if difference.high < 0:
        return REPRODUCED
    if difference.low > 0 and mdm_plateaued:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def rules(settings: DataSettings, unigram: float) -> list[str]:
    """The rules the report states before its numbers."""
    return rule_text("seeds", "learned") + [
        "**Rule (data-constrained).** Per seed: the AR's best = the lowest validation of its "
        f"weight-decay sweep {list(settings.weight_decays)}; the MDM's best = its lowest. "
        "Headline: the paired difference MDM best - AR best over seeds. *Reproduced*: its "
        "whole interval below 0. *Not reproduced*: its whole interval above 0 and the MDM "
        "plateaued in every seed (its mean validation over the last "
        f"{RULE['plateau_window']:.0%} of validations less than {RULE['plateau_drop']} nats "
        "below the window before). "
        "*Inconclusive* otherwise. Reported, not judged: the best epochs (AR earlier?) and "
        "the AR's data-reuse half-life R* (Muennighoff et al.'s form, fitted on the repeated "
        "run up to its best against a fresh-data run on the same schedule). Learned checks: "
        f"each model's best more than {RULE['learned_margin']} nats below the unigram entropy "
        f"({unigram:.3f}) in every seed."
    ]


def best_of_sweep(runs: dict[str, list[dict]], ar_names: list[str]) -> dict[str, Any]:
    """The lowest validation of the AR sweep's runs, naming the run."""
    return min(
        (best_point(runs[n]) | {"run": n} for n in ar_names),
        key=lambda r: r["val_nats_per_token"],
    )


def half_lives(
    runs: dict[int, dict[str, list[dict]]], first_ar: str
) -> tuple[dict[int, dict | None], Interval | None]:
    """Each seed's fitted AR half-life R*, and the seed interval of those not at the bound."""
    fits = {
        s: fit_half_life(effective_epochs(run[first_ar], run["ar-fresh"]))
        for s, run in runs.items()
    }
    r_values = [f["r_star"] for f in fits.values() if f and not f["at_bound"]]
    return fits, seed_interval(r_values) if r_values else None


def fit_text(fit: dict[str, Any] | None) -> str:
    if not fit:
        return "not fitted"
    return f"{fit['r_star']:.3g}" + (" (at the bound: no saturation)" if fit["at_bound"] else "")


PER_SEED_COLUMNS = [
    "seed",
    "AR best (run, epoch)",
    "MDM best (epoch)",
    "MDM final",
    "MDM plateaued",
    "AR R* (fit)",
]


def per_seed_table(settings: DataSettings, runs: dict, ar_best, mdm_best, flat, fits) -> Table:
    return Table(
        "Per seed",
        PER_SEED_COLUMNS,
        [
            [
                s,
                f"{ar_best[s]['val_nats_per_token']:.4f} ({ar_best[s]['run']}, "
                f"{ar_best[s]['epoch']:.1f})",
                f"{mdm_best[s]['val_nats_per_token']:.4f} ({mdm_best[s]['epoch']:.1f})",
                runs[s]["mdm"][-1]["val_nats_per_token"],
                "yes" if flat[s] else "no",
                fit_text(fits[s]),
            ]
            for s in runs
        ],
        note=f"{settings.unique_tokens} unique training tokens (rows drawn over the whole "
        f"split), AR {settings.ar_epochs} epochs, MDM {settings.mdm_epochs}; nats/token on "
        "the whole validation split (AR exact NLL, MDM NELBO, an upper bound on its NLL).",
    )


def reported_notes(settings: DataSettings, epochs, peak: str, r_star, flat) -> list[str]:
    """What is reported beside the verdict, not judged: the best epochs and R*."""
    return [
        f"Best epochs: AR {epochs['ar'].text(3)}, MDM {epochs['mdm'].text(3)}; AR earlier: "
        f"**{peak}**.",
        "AR data-reuse half-life R*: "
        + ("not fitted" if r_star is None else f"{r_star.text(3)} epochs")
        + " (published ~15 for AR). The MDM's R* is not measured: its fresh-data reference "
        f"would cost another {settings.mdm_epochs} epochs per seed; its curve "
        + ("plateaued" if all(flat.values()) else "had not plateaued")
        + " by the end.",
    ]


def learned_checks(ar_best: dict, mdm_best: dict, unigram: float) -> list[LearnedCheck]:
    """Each model's best validation below the unigram plateau, in every seed."""
    return [
        LearnedCheck(
            label,
            f"best validation more than {RULE['learned_margin']} nats below the unigram entropy "
            f"{unigram:.3f}, every seed",
            ", ".join(f"{b['val_nats_per_token']:.3f}" for b in best.values()),
            all(b["val_nats_per_token"] < unigram - RULE["learned_margin"] for b in best.values()),
        )
        for label, best in (("AR (best of the sweep)", ar_best), ("MDM", mdm_best))
    ]


def judge(
    scale: str,
    settings: DataSettings,
    runs: dict[int, dict[str, list[dict]]],
    unigram: float,
    out: Path,
) -> FindingResult:
    report = start_report(FINDING, scale, out, settings, rules(settings, unigram))
    seeds = list(runs)
    ar_names = [ar_name(wd) for wd in settings.weight_decays]
    ar_best = {s: best_of_sweep(runs[s], ar_names) for s in seeds}
    mdm_best = {s: best_point(runs[s]["mdm"]) for s in seeds}
    difference = paired_difference(
        [mdm_best[s]["val_nats_per_token"] for s in seeds],
        [ar_best[s]["val_nats_per_token"] for s in seeds],
    )
    flat = {s: plateaued(runs[s]["mdm"]) for s in seeds}
    epochs = {
        "ar": seed_interval([ar_best[s]["epoch"] for s in seeds]),
        "mdm": seed_interval([mdm_best[s]["epoch"] for s in seeds]),
    }
    peak = direction_verdict(epochs["ar"], epochs["mdm"])
    fits, r_star = half_lives(runs, ar_names[0])
    report.table(per_seed_table(settings, runs, ar_best, mdm_best, flat, fits))
    _figure(report, runs, ar_names)
    return finish_report(
        report,
        FINDING,
        scale,
        measured=f"best loss MDM - AR {difference.text(3)} nats/token (paired over seeds); best "
        f"epoch AR {epochs['ar'].value:.1f}, MDM {epochs['mdm'].value:.1f}; MDM plateaued: "
        f"{sum(flat.values())} of {len(seeds)} seeds",
        verdict=data_verdict(difference, all(flat.values())),
        rule="paired MDM-AR best-loss difference below 0 (reproduced), or above 0 with the MDM "
        "plateaued (not reproduced), 95% seed interval",
        checks=learned_checks(ar_best, mdm_best, unigram),
        numbers={
            "difference": difference.as_dict(),
            "ar_best": ar_best,
            "mdm_best": mdm_best,
            "best_epoch": {o: v.as_dict() for o, v in epochs.items()},
            "peak_verdict": peak,
            "mdm_plateaued": flat,
            "half_life_fits": fits,
            "r_star": None if r_star is None else r_star.as_dict(),
            "curves": runs,
        },
        notes=reported_notes(settings, epochs, peak, r_star, flat),
    )


def _figure(report: Report, runs: dict[int, dict[str, list[dict]]], ar_names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    names = [*ar_names, "ar-fresh", "mdm"]
    for index, name in enumerate(names):
        for k, curve in enumerate(runs.values()):
            axis.plot(
                [r["epoch"] for r in curve[name]],
                [r["val_nats_per_token"] for r in curve[name]],
                color=f"C{index}",
                alpha=0.8 if k == 0 else 0.35,
                linewidth=1.2 if k == 0 else 0.8,
                label=name if k == 0 else None,
            )
    axis.set_xscale("log")
    axis.set_xlabel("epochs of the unique tokens (fresh run: tokens / unique tokens)")
    axis.set_ylabel("validation nats/token (whole split)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    axis.set_title("Repeated data: every seed (first seed bold)")
    report.plot("data_constrained_curves", figure, "Validation loss vs epochs")


FINDING = Finding(
    "data-constrained",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 25 GPU-hours (3 seeds x (3 AR runs of 16 epochs + an MDM run of 200 epochs "
    "+ a fresh AR run) of GPT-2 small on 25M unique tokens)",
    rule=RULE,
    gpu_budget="GPT-2 small on 25M unique OpenWebText tokens, MDM 200 epochs, 3 seeds",
    cost="3 seeds x (3 AR runs of 16 epochs, a 150-epoch MDM run, a fresh-data AR run)",
    runs=runs,
    judged_by=("eval.budgets", "eval.findings.reuse_half_life"),
)
