"""The comparison's learning curves: both models' validation loss at the same training-FLOP
budgets, the compute multiplier with its interval, power-law fits, the unigram floor and each
model's best and final point. Read from the runs' own ``metrics.jsonl`` (the ``--curve-points``
records: the same validation rows and fixed noise for both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.curves import Headline, compute_multipliers, fit_power_law, headline_multiplier
from eval.report import Report, Table
from shared.checkpoint import checkpoint_name, read_best
from shared.validation import standard_error

# Nie et al. 2024 ("Scaling up Masked Diffusion Models on Text", SMDM): an MDM needs about 16x
# the compute of an AR model to reach the same validation loss.
PUBLISHED_MULTIPLIER = 16.0
Z95 = 1.959964
OVERFIT_TOLERANCE = 0.01  # final validation more than 1% above the best: say so


def eval_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's validation records in step order, one per step and kind (curve point or not,
    rows validated on); a resumed run's last word wins."""
    by_step: dict[tuple[int, bool, int], dict[str, Any]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
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


def curve_figure(ar: list[dict], mdm: list[dict], unigram: float):
    # matplotlib is an optional extra (quality); imported only when a report draws a figure
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for label, curve in (("AR (exact NLL)", ar), ("MDM (NELBO)", mdm)):
        xs = [c for c, _ in points(curve)]
        axis.plot(xs, [v for _, v in points(curve)], marker="o", label=label)
    xs = [c for c, _ in points(mdm)]
    axis.fill_between(
        xs,
        [v for _, v in points(mdm, -1)],
        [v for _, v in points(mdm, +1)],
        alpha=0.25,
        label="MDM 95% interval",
    )
    axis.axhline(unigram, color="gray", linestyle="--", label="unigram entropy (floor)")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("training FLOPs")
    axis.set_ylabel("validation nats/token")
    axis.set_title("Learning curves on one compute axis")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    return figure


def floor_headline(
    ar: list[dict[str, Any]], mdm: list[dict[str, Any]], unigram: float
) -> tuple[list[tuple[float, float]], Headline | None]:
    """(the AR points the headline may use, the headline multiplier). Rule: a multiplier means
    something only where the AR model has learned more than token frequencies, so the headline
    uses AR points below the unigram floor; its interval comes from the MDM curve's 95% band."""
    learned = [(c, loss) for c, loss in points(ar) if loss < unigram]
    return learned, headline_multiplier(learned, points(mdm), points(mdm, -1), points(mdm, +1))


def curves_section(report: Report, out: Path, unigram: float) -> dict[str, Any]:
    """Add the curves, the multiplier and the floors to ``report``; returns their numbers."""
    ar, mdm = read_curve(out / "ar"), read_curve(out / "mdm")
    if len(ar) < 2 or len(mdm) < 2:
        report.text(
            "**Learning curves.** Not measured: fewer than 2 curve points per run "
            "(train with `--curve-points N`, N >= 2)."
        )
        return {"measured": False}
    multipliers = compute_multipliers(points(ar), points(mdm))
    learned, headline = floor_headline(ar, mdm, unigram)
    fits = {name: fit_power_law(points(curve)) for name, curve in (("AR", ar), ("MDM", mdm))}
    shape = {"AR": best_and_final(ar), "MDM": best_and_final(mdm)}

    if not learned:
        summary = "no AR point is below the unigram floor yet, so no multiplier is reported"
    elif headline is None:
        summary = (
            "the MDM does not reach the AR's validation loss at any AR point below the unigram "
            "floor on this budget: no multiplier"
        )
    else:
        high = "not reached" if headline.high is None else f"{headline.high:.1f}x"
        low = "-" if headline.low is None else f"{headline.low:.1f}x"
        summary = (
            f"at {headline.ar_flops:.3g} training FLOPs (the largest AR budget below the unigram "
            f"floor whose loss the MDM's curve reaches) the MDM needs **{headline.value:.1f}x** "
            "the AR's compute to match its validation loss (95% interval from the MDM's band: "
            f"[{low}, {high}]; it covers validation rows and noise, not training randomness: "
            "retrain with `--seed N` for that spread)"
        )
    overfit = [
        f"{name}'s validation rises {s['rise']:.1%} from its best (step {s['best_step']}) to its "
        f"final point (step {s['final_step']})"
        for name, s in shape.items()
        if s["overfits"]
    ]
    beyond = [
        name
        for name, curve in (("AR", ar), ("MDM", mdm))
        if min(r["val_nats_per_token"] for r in curve) > unigram - 0.05
    ]
    report.text(
        "**Learning curves.** Both models are validated at the same training-FLOP budgets on the "
        "same rows with fixed noise; "
        + summary
        + f". Published reference: Nie et al. 2024 (SMDM) found about {PUBLISHED_MULTIPLIER:.0f}x."
        + (" " + "; ".join(overfit) + "." if overfit else "")
        + f" Floor: the unigram model of the training split scores {unigram:.3f} nats/token"
        + (
            f"; {' and '.join(beyond)} did not get clearly below it (still on the unigram plateau)."
            if beyond
            else "; both models got below it."
        )
    )
    report.plot("learning_curves", curve_figure(ar, mdm, unigram), "Validation loss vs FLOPs")
    rows = []
    for a, m in zip(ar, mdm):
        half = Z95 * standard_error(m)
        rows.append(
            [
                a["step"],
                a["flops"],
                a["val_nats_per_token"],
                m["val_nats_per_token"],
                f"[{m['val_nats_per_token'] - half:.4f}, {m['val_nats_per_token'] + half:.4f}]",
                a["val_bpb"],
                m["val_bpb"],
            ]
        )
    report.table(
        Table(
            "Learning curves (validation subset, fixed noise)",
            [
                "step",
                "AR FLOPs",
                "AR nats/token",
                "MDM nats/token",
                "MDM 95%",
                "AR bits/byte",
                "MDM bits/byte",
            ],
            rows,
            note=f"Floor: unigram entropy {unigram:.4f} nats/token. The MDM interval is over the "
            "validation rows and their noise draws (a ratio estimate's standard error).",
        )
    )
    report.table(
        Table(
            "Compute multiplier: MDM FLOPs to reach each AR point's loss",
            ["AR FLOPs", "AR nats/token", "MDM FLOPs", "multiplier"],
            [
                [
                    m.ar_flops,
                    m.ar_loss,
                    m.mdm_flops or "not reached",
                    "not reached" if m.value is None else m.value,
                ]
                for m in multipliers
            ],
            note="Interpolated linearly in log-FLOPs vs log-loss between the MDM's points. "
            f"Published: about {PUBLISHED_MULTIPLIER:.0f}x (Nie et al. 2024, SMDM).",
        )
    )
    report.table(
        Table(
            "Power-law fits L(C) = E + A (C / C0)^-alpha",
            ["model", "E", "A", "alpha", "C0", "rms residual", "best (step)", "final (step)"],
            [
                [name]
                + ([f.E, f.A, f.alpha, f.scale, f.rms] if f else ["too few points"] + ["-"] * 4)
                + [
                    f"{shape[name]['best']:.4f} ({shape[name]['best_step']})",
                    f"{shape[name]['final']:.4f} ({shape[name]['final_step']})",
                ]
                for name, f in fits.items()
            ],
        )
    )
    return {
        "measured": True,
        "ar": ar,
        "mdm": mdm,
        "unigram_entropy": unigram,
        "multipliers": [m.__dict__ | {"value": m.value} for m in multipliers],
        "headline": None if headline is None else headline.__dict__,
        "published_multiplier": PUBLISHED_MULTIPLIER,
        "fits": {k: (None if f is None else f.__dict__) for k, f in fits.items()},
        "best_and_final": shape,
    }
