"""Finding: a masked diffusion model initialised from a trained AR model's weights (and trained on
under the diffusion objective, with attention annealing) reaches a given MDM validation loss with
far less compute than one trained from scratch. The AR pretraining compute is counted both
separately and together."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.budgets import seed_spread
from eval.curves import entropy_of_counts, flops_to_reach
from eval.experiments.compare import token_frequencies
from eval.experiments.compare_curves import points, read_curve
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
from eval.findings.verdicts import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    LearnedCheck,
    paired_difference,
)
from eval.report import Report, Table

CLAIM = Claim(
    "Adapting an AR model into an MDM",
    "Initialising a masked diffusion model from AR weights and continuing under the diffusion "
    "objective reaches a given MDM loss with far less compute than training it from scratch.",
    "Gong et al. 2024 (DiffuLLaMA); Dream 7B (initialised from Qwen2.5)",
)


@dataclass(frozen=True)
class AdaptSettings:
    seeds: tuple[int, ...]
    preset: str
    ar_steps: int
    mdm_steps: int  # each MDM run (from scratch, adapted): the same budget
    anneal_steps: int
    curve_points: int
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": AdaptSettings((0, 1), "smoke", 40, 40, 5, 4, dict(eval_every=40)),
    # The demo recipe (d128, BPE 512, window 8) at its own 320 steps per run, 3 seeds.
    "cpu": AdaptSettings((0, 1, 2), "demo", 320, 320, 32, 8),
    "gpu": AdaptSettings((0, 1, 2), "owt-small", 20000, 20000, 2000, 10),
}
RUNS = ("ar", "mdm-scratch", "mdm-adapted")
# Declared before any run (hashed into the registration): "far less compute" means at least this
# factor less MDM compute to reach the scratch run's final loss; a model has learned when its
# final validation loss is this many nats below the unigram entropy.
RULE = {"far_less": 2.0, "plateau_margin": 0.1}


def run(settings: AdaptSettings, job: Job) -> FindingResult:
    stages = Stages(job.out, job.force, job.stop)
    per_seed = {}
    for seed in settings.seeds:
        folder = job.out / f"seed-{seed}"
        per_seed[seed] = train_seed(settings, job, folder, seed)
    first = job.out / f"seed-{settings.seeds[0]}"
    unigram = stages.run(
        "unigram",
        {"ar_steps": settings.ar_steps},
        lambda: entropy_of_counts(token_frequencies(*load(first, "ar")[1:])),
    )
    return judge(job.scale, settings, per_seed, unigram, job.out)


def runs(settings: AdaptSettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run this finding trains (for the registration; the adapted run's ``init_from`` is
    its seed's AR run)."""
    planned = {}
    for seed in settings.seeds:
        shared = settings.overrides | {"curve_points": settings.curve_points, "seed": seed}
        mdm = shared | {"objective": "mdm", "max_steps": settings.mdm_steps}
        planned |= {
            f"seed-{seed}/ar": (
                settings.preset,
                shared | {"objective": "ar", "max_steps": settings.ar_steps},
            ),
            f"seed-{seed}/mdm-scratch": (settings.preset, mdm),
            f"seed-{seed}/mdm-adapted": (
                settings.preset,
                mdm | {"attention_anneal_steps": settings.anneal_steps},
            ),
        }
    return planned


def train_seed(settings: AdaptSettings, job: Job, out: Path, seed: int) -> dict[str, Any]:
    """One seed's AR run, MDM from scratch and MDM adapted from that AR run: their summaries and
    learning curves."""
    force = job.force
    shared = settings.overrides | {"curve_points": settings.curve_points, "seed": seed} | job.extra
    summaries = {
        "ar": train_or_reuse(
            "ar",
            out / "ar",
            settings.preset,
            {"objective": "ar"},
            shared | {"max_steps": settings.ar_steps},
            force,
        )
    }
    mdm = shared | {"max_steps": settings.mdm_steps}
    summaries["mdm-scratch"] = train_or_reuse(
        "mdm from scratch", out / "mdm-scratch", settings.preset, {"objective": "mdm"}, mdm, force
    )
    summaries["mdm-adapted"] = train_or_reuse(
        "mdm adapted from ar",
        out / "mdm-adapted",
        settings.preset,
        {"objective": "mdm"},
        mdm | {"init_from": str(out / "ar"), "attention_anneal_steps": settings.anneal_steps},
        force,
    )
    curves = {name: read_curve(out / name) for name in RUNS}
    return {"summaries": summaries, "curves": curves}


def compute_saving(
    adapted: list[dict], scratch: list[dict], ar_flops: float
) -> dict[str, float | bool | None]:
    """How much less compute the adapted run needs to reach the scratch run's final loss: the
    scratch run's FLOPs / the adapted run's FLOPs at that loss (interpolated on its curve), alone
    and with the AR pretraining added. ``at_first_point``: reached already at the adapted run's
    first validation, so its FLOPs are an upper bound and the saving a lower bound. An adapted
    run that never reaches it within the same budget saved nothing: its saving is at most 1
    (``never_reached``), recorded as 1."""
    target = scratch[-1]["val_nats_per_token"]
    needed = flops_to_reach(points(adapted), target)
    scratch_flops = scratch[-1]["flops"]
    if needed is None:
        return {
            "needed_flops": None,
            "saving": 1.0,
            "saving_with_ar": scratch_flops / (scratch_flops + ar_flops),
            "at_first_point": False,
            "never_reached": True,
        }
    return {
        "needed_flops": needed,
        "saving": scratch_flops / needed,
        "saving_with_ar": scratch_flops / (needed + ar_flops),
        "at_first_point": needed <= adapted[0]["flops"],
        "never_reached": False,
    }


def factor_text(interval: Interval) -> str:
    """A compute ratio scratch/adapted in words: "3.2x less [2.1, 4.9]" or "1.7x more"."""
    if interval.value >= 1:
        return f"{interval.value:.2g}x less (95%: {interval.low:.2g}x to {interval.high:.2g}x)"
    return (
        f"{1 / interval.value:.2g}x more (95%: saving {interval.low:.2g}x to {interval.high:.2g}x, "
        "below 1 = more)"
    )


def geometric_interval(values: list[float]) -> Interval:
    """The seed interval of a ratio, taken on its logarithm."""
    spread = seed_spread(values, geometric=True)
    if spread.low is None:  # one seed: unbounded, as seed_interval
        return Interval(spread.mean, 0.0, math.inf)
    return Interval(spread.mean, spread.low, spread.high)


def saving_verdict(saving: Interval) -> str:
    """Reproduced: the whole interval of the saving is at least RULE["far_less"]; not
    reproduced: the whole interval is below it; inconclusive otherwise."""
    if saving.low >= RULE["far_less"]:
        return REPRODUCED
    if saving.high < RULE["far_less"]:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def rules(settings: AdaptSettings, unigram: float) -> list[str]:
    """The rules the report states before its numbers."""
    return rule_text("seeds", "learned") + [
        "**Rule (adaptation).** Per seed, the compute saving is the from-scratch MDM's "
        "training FLOPs over the adapted MDM's FLOPs to reach the scratch run's final "
        "validation NELBO (interpolated on the adapted run's learning curve; an adapted run "
        "that never reaches it saved nothing, 1x). Its interval is the t interval of the "
        "log saving over the seeds. *Reproduced* ('far less compute'): the whole interval "
        f"is at least {RULE['far_less']:g}x. *Not reproduced*: the whole interval is below "
        f"{RULE['far_less']:g}x. *Inconclusive* otherwise. The saving counting the AR "
        "pretraining FLOPs too is reported beside it, not judged. Learned checks: the AR "
        "run's, the scratch MDM's and the adapted MDM's final validation losses are more than "
        f"{RULE['plateau_margin']} nats below the unigram entropy ({unigram:.3f}). "
        "Adaptation: weights from the AR run's newest checkpoint, the [MASK] embedding the "
        "mean of the embedding rows, attention annealed from causal to full over the first "
        f"{settings.anneal_steps} steps."
    ]


def runs_table(per_seed: dict[int, dict[str, Any]]) -> Table:
    return Table(
        "Runs, per seed",
        ["seed", "run", "steps", "training FLOPs", "first curve point", "final NELBO/NLL"],
        [
            [
                seed,
                name,
                run["summaries"][name]["step"],
                run["curves"][name][-1]["flops"],
                run["curves"][name][0]["val_nats_per_token"],
                run["curves"][name][-1]["val_nats_per_token"],
            ]
            for seed, run in per_seed.items()
            for name in RUNS
        ],
        note="nats/token on the fixed validation rows (AR: exact NLL; MDM: NELBO). The "
        "adapted run's FLOPs exclude the AR pretraining.",
    )


def how_read(saving: dict[str, Any]) -> str:
    if saving["never_reached"]:
        return "never reached: at most 1x"
    return "at the first curve point: a lower bound" if saving["at_first_point"] else "interpolated"


def savings_table(savings: dict[int, dict[str, Any]]) -> Table:
    return Table(
        "Compute saving, per seed",
        ["seed", "saving (MDM compute)", "with the AR pretraining", "how it was read"],
        [
            [seed, saving["saving"], saving["saving_with_ar"], how_read(saving)]
            for seed, saving in savings.items()
        ],
    )


def learned_checks(finals: dict[str, list[float]], unigram: float) -> list[LearnedCheck]:
    """Every run's final validation loss below the unigram plateau, in every seed."""
    return [
        LearnedCheck(
            label,
            f"final validation loss more than {RULE['plateau_margin']} nats below the unigram "
            f"entropy {unigram:.3f}, every seed",
            ", ".join(f"{v:.3f}" for v in finals[name]),
            max(finals[name]) < unigram - RULE["plateau_margin"],
        )
        for name, label in (
            ("ar", "AR"),
            ("mdm-scratch", "MDM from scratch"),
            ("mdm-adapted", "MDM adapted"),
        )
    ]


def seed_savings(per_seed: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {
        seed: compute_saving(
            run["curves"]["mdm-adapted"],
            run["curves"]["mdm-scratch"],
            run["summaries"]["mdm-adapted"]["init_from"]["total_flops"],
        )
        for seed, run in per_seed.items()
    }


def judge(
    scale: str,
    settings: AdaptSettings,
    per_seed: dict[int, dict[str, Any]],
    unigram: float,
    out: Path,
) -> FindingResult:
    report = start_report(FINDING, scale, out, settings, rules(settings, unigram))
    seeds = list(per_seed)
    savings = seed_savings(per_seed)
    finals = {
        name: [run["curves"][name][-1]["val_nats_per_token"] for run in per_seed.values()]
        for name in RUNS
    }
    saving = geometric_interval([savings[s]["saving"] for s in seeds])
    with_ar = geometric_interval([savings[s]["saving_with_ar"] for s in seeds])
    difference = paired_difference(finals["mdm-adapted"], finals["mdm-scratch"])
    report.table(runs_table(per_seed))
    report.table(savings_table(savings))
    first = per_seed[seeds[0]]
    ar_flops = first["summaries"]["mdm-adapted"]["init_from"]["total_flops"]
    _figure(report, first["curves"], ar_flops, seeds[0])
    lower_bound = any(savings[s]["at_first_point"] for s in seeds)
    return finish_report(
        report,
        FINDING,
        scale,
        measured=f"to reach the scratch MDM's final loss the adapted MDM needs "
        f"{factor_text(saving)} MDM compute; counting the AR pretraining, "
        f"{factor_text(with_ar)}; final NELBO adapted - scratch {difference.text(3)} nats/token",
        verdict=saving_verdict(saving),
        rule=f"the saving's whole 95% seed interval at least {RULE['far_less']:g}x",
        checks=learned_checks(finals, unigram),
        numbers={
            "savings": savings,
            "saving": saving.as_dict(),
            "saving_with_ar": with_ar.as_dict(),
            "final": finals,
            "final_difference": difference.as_dict(),
            "unigram": unigram,
        },
        notes=[LOWER_BOUND] if lower_bound else [],
    )


LOWER_BOUND = (
    "In some seed the adapted run was already below the scratch run's final loss at its "
    "first validation: that seed's saving is a lower bound."
)


def _figure(report: Report, curves: dict, ar_flops: float, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for name, label, shift in (
        ("ar", "AR (exact NLL)", 0.0),
        ("mdm-scratch", "MDM from scratch", 0.0),
        ("mdm-adapted", "MDM adapted (MDM FLOPs only)", 0.0),
        ("mdm-adapted", "MDM adapted (+ AR pretraining FLOPs)", ar_flops),
    ):
        xs = [r["flops"] + shift for r in curves[name]]
        style = "--" if shift else "-"
        axis.plot(
            xs, [r["val_nats_per_token"] for r in curves[name]], style, marker="o", label=label
        )
    axis.set_xscale("log")
    axis.set_xlabel("training FLOPs")
    axis.set_ylabel("validation nats/token")
    axis.set_title(f"From scratch vs adapted from AR (seed {seed})")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    report.plot("adaptation_curves", figure, "Validation loss vs training FLOPs")


FINDING = Finding(
    "adaptation",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 12 GPU-hours (3 seeds x 3 runs x 20k steps of GPT-2 small on OpenWebText)",
    rule=RULE,
    gpu_budget="GPT-2 small on OpenWebText, 20k steps per run, 3 seeds",
    cost="3 seeds x 3 runs of 320 steps (AR, MDM from scratch, MDM adapted)",
    runs=runs,
    judged_by=("eval.budgets", "eval.curves"),
)
