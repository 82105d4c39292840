"""Finding: a masked diffusion model initialised from a trained AR model's weights (and trained on
under the diffusion objective, with attention annealing) reaches a given MDM validation loss with
far less compute than one trained from scratch. The AR pretraining compute is counted both
separately and together."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.curves import flops_to_reach
from eval.experiments.compare_curves import points, read_curve
from eval.experiments.stages import train_or_reuse
from eval.findings.common import (
    Claim,
    Finding,
    FindingResult,
    Job,
    finish_report,
    rule_text,
    start_report,
)
from eval.findings.verdicts import Interval, direction_verdict
from eval.report import Report, Table

CLAIM = Claim(
    "Adapting an AR model into an MDM",
    "Initialising a masked diffusion model from AR weights and continuing under the diffusion "
    "objective reaches a given MDM loss with far less compute than training it from scratch.",
    "Gong et al. 2024 (DiffuLLaMA); Dream 7B (initialised from Qwen2.5)",
)


@dataclass(frozen=True)
class AdaptSettings:
    preset: str
    ar_steps: int
    mdm_steps: int  # each MDM run (from scratch, adapted): the same budget
    anneal_steps: int
    curve_points: int
    overrides: dict[str, Any] = field(default_factory=dict)


SETTINGS = {
    "smoke": AdaptSettings("smoke", 40, 40, 5, 4, dict(eval_every=40)),
    # The demo recipe (d128, BPE 512, window 8), 600 steps per run.
    "cpu": AdaptSettings("demo", 600, 600, 60, 8),
    "gpu": AdaptSettings("owt-small", 20000, 20000, 2000, 10),
}
RUNS = ("ar", "mdm-scratch", "mdm-adapted")


def run(settings: AdaptSettings, job: Job) -> FindingResult:
    out, force, scale = job.out, job.force, job.scale
    shared = settings.overrides | {"curve_points": settings.curve_points} | job.extra
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
    return judge(scale, settings, summaries, curves, out)


def final_interval(curve: list[dict[str, Any]]) -> Interval:
    """The last validation with its 95% band (``compare_curves.points``)."""
    (_, low), (_, value), (_, high) = (points(curve[-1:], band)[0] for band in (-1, 0, 1))
    return Interval(value, low, high)


def compute_saving(
    adapted: list[dict], scratch: list[dict], ar_flops: float
) -> dict[str, float | bool | None]:
    """How much less compute the adapted run needs to reach the scratch run's final loss: the
    scratch run's FLOPs / the adapted run's FLOPs at that loss (interpolated on its curve), alone
    and with the AR pretraining added. ``at_first_point``: reached already at the adapted run's
    first validation, so its FLOPs are an upper bound and the saving a lower bound."""
    target = scratch[-1]["val_nats_per_token"]
    needed = flops_to_reach(points(adapted), target)
    if needed is None:
        return {"needed_flops": None, "saving": None, "saving_with_ar": None}
    scratch_flops = scratch[-1]["flops"]
    return {
        "needed_flops": needed,
        "saving": scratch_flops / needed,
        "saving_with_ar": scratch_flops / (needed + ar_flops),
        "at_first_point": needed <= adapted[0]["flops"],
    }


def judge(
    scale: str, settings: AdaptSettings, summaries: dict, curves: dict, out: Path
) -> FindingResult:
    report = start_report(
        FINDING,
        scale,
        out,
        settings,
        rule_text("direction")
        + [
            "Here A = the adapted MDM's validation NELBO at the end of its budget, B = the "
            "from-scratch MDM's at the same MDM compute (the same fixed validation rows and noise; "
            "95% intervals from each estimate's standard error). The compute saving (the "
            "scratch run's FLOPs over the adapted run's FLOPs to reach the scratch run's final "
            "loss) is reported alone and with the AR pretraining compute added; it is a "
            "measurement, not part of the verdict. Adaptation: weights from the AR run's newest "
            f"checkpoint, the [MASK] embedding the mean of the embedding rows, attention annealed "
            f"from causal to full over the first {settings.anneal_steps} steps."
        ],
    )
    adapted, scratch = final_interval(curves["mdm-adapted"]), final_interval(curves["mdm-scratch"])
    verdict = direction_verdict(adapted, scratch)
    ar_flops = summaries["mdm-adapted"]["init_from"]["total_flops"]
    saving = compute_saving(curves["mdm-adapted"], curves["mdm-scratch"], ar_flops)
    first = {name: curves[name][0]["val_nats_per_token"] for name in RUNS}
    report.table(
        Table(
            "Runs",
            ["run", "steps", "training FLOPs", "first curve point", "final (95%)"],
            [
                [
                    name,
                    summaries[name]["step"],
                    curves[name][-1]["flops"],
                    first[name],
                    final_interval(curves[name]).text(4),
                ]
                for name in RUNS
            ],
            note="nats/token on the fixed validation rows (AR: exact NLL; MDM: NELBO). The "
            f"adapted run's FLOPs exclude the AR pretraining ({ar_flops:.3g} FLOPs).",
        )
    )
    _figure(report, curves, ar_flops)
    if saving["saving"] is None:
        saving_text = "the adapted run never reaches the scratch run's final loss"
    else:
        bound = ">= " if saving["at_first_point"] else ""
        saving_text = (
            f"the adapted run reaches the scratch run's final loss with {bound}"
            f"{saving['saving']:.1f}x less MDM compute; counting the AR pretraining too, "
            f"{bound}{saving['saving_with_ar']:.2f}x"
        )
    return finish_report(
        report,
        FINDING,
        scale,
        measured=f"final NELBO adapted {adapted.text(4)} vs scratch {scratch.text(4)}; "
        + saving_text,
        verdict=verdict,
        rule="adapted MDM's final NELBO below the from-scratch MDM's at equal MDM compute, "
        "95% intervals separated",
        numbers={
            "final": {"adapted": adapted.as_dict(), "scratch": scratch.as_dict()},
            "saving": saving,
            "ar_flops": ar_flops,
            "first_points": first,
        },
    )


def _figure(report: Report, curves: dict, ar_flops: float) -> None:
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
    axis.set_title("From scratch vs adapted from AR")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    report.plot("adaptation_curves", figure, "Validation loss vs training FLOPs")


FINDING = Finding(
    "adaptation",
    CLAIM,
    SETTINGS,
    run,
    gpu_wall="about 4 GPU-hours (3 runs x 20k steps of GPT-2 small on OpenWebText)",
)
