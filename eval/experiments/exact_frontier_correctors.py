"""The exact frontier's two sampler questions, each answered by a rule fixed before the run.

Correctors (ReMDM for the masked family, the Psi-samplers for the uniform-state one): does a
corrector bring the sampler's output closer to the language at equal NFE per token, and from how
many steps? Each corrector setting is paired with the plain sampler of its family at the same
steps (``CORRECTOR_BASES``; the same model calls), seed by seed (the same trained network):
the difference TV(corrector, p) - TV(plain, p) gets a 95% t-interval over the seeds. Verdict:
"lowers" when the interval lies below 0, "raises" when above, otherwise "not separated"; with the
exact denoiser the difference is exact (no interval). "From how many steps": the smallest step
count of the grid from which every larger one's verdict is "lowers" (none if the largest is not).

EB (the entropy-bounded sampler) between one token per step and the threshold sampler: each
setting's expected NFE per token (exact, from the program's expected model calls) and TV, beside
the one-per-step sampler and the threshold settings; each EB setting is paired with the
threshold setting of the nearest trained NFE by the same seed-paired rule.
"""

from __future__ import annotations

from typing import Any

from eval.experiments.exact_frontier_setup import (
    CORRECTED_STEPS,
    CORRECTOR_BASES,
    HEADLINE_METRIC,
    interval_text,
    spread_of,
)
from eval.report import Table

VERDICTS = ("lowers", "raises", "not separated")


def paired(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """first - second of the trained TV, seed by seed, and of the exact-denoiser TV."""
    key = f"total_{HEADLINE_METRIC}"
    trained = spread_of([a - b for a, b in zip(first[key], second[key])])
    return {"trained": trained, "exact": first["sampler"]["mean"] - second["sampler"]["mean"]}


def verdict(spread: dict[str, Any]) -> str:
    if spread["high"] is not None and spread["high"] < 0:
        return "lowers"
    if spread["low"] is not None and spread["low"] > 0:
        return "raises"
    return "not separated"


def corrector_verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One verdict per corrector setting against its plain sampler at the same steps."""
    by_key = {(r["family"], r["sampler_rule"], r["steps"]): r for r in rows}
    verdicts = []
    for (family, sampler), base in CORRECTOR_BASES.items():
        for steps in CORRECTED_STEPS:
            corrected, plain = (
                by_key.get((family, sampler, steps)),
                by_key.get((family, base, steps)),
            )
            if corrected is None or plain is None:
                continue
            difference = paired(corrected, plain)
            verdicts.append(
                {
                    "corrector": f"{family} {sampler}",
                    "setting": corrected["setting"],
                    "plain": plain["setting"],
                    "steps": steps,
                    "difference": difference,
                    "verdict": verdict(difference["trained"]),
                    "exact_verdict": "lowers"
                    if difference["exact"] < -1e-12
                    else ("raises" if difference["exact"] > 1e-12 else "equal"),
                }
            )
    return verdicts


def from_steps(verdicts: list[dict[str, Any]], key: str = "verdict") -> int | None:
    """The smallest step count from which every larger one's verdict is "lowers"."""
    found = None
    for entry in sorted(verdicts, key=lambda v: v["steps"], reverse=True):
        if entry[key] != "lowers":
            break
        found = entry["steps"]
    return found


def corrector_summary(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per corrector: from how many steps it lowers TV, trained and with the exact denoiser."""
    names = list(dict.fromkeys(v["corrector"] for v in verdicts))
    summary = {}
    for name in names:
        mine = [v for v in verdicts if v["corrector"] == name]
        summary[name] = {
            "from_steps": from_steps(mine),
            "exact_from_steps": from_steps(mine, "exact_verdict"),
            "verdicts": {v["steps"]: v["verdict"] for v in mine},
        }
    return summary


def corrector_text(summary: dict[str, Any]) -> str:
    def steps_text(value: int | None) -> str:
        return "at no step count of the grid" if value is None else f"from {value} steps on"

    parts = [
        f"{name}: trained networks {steps_text(s['from_steps'])}, exact denoiser "
        f"{steps_text(s['exact_from_steps'])} (trained verdicts by steps: "
        + ", ".join(f"{k}: {v}" for k, v in s["verdicts"].items())
        + ")"
        for name, s in summary.items()
    ]
    return (
        "**Correctors** (rule fixed before the run: the corrector's TV minus the plain "
        "sampler's at the same steps, paired by seed, 95% t-interval below 0). A corrector "
        "lowers the sampler's TV to the language " + "; ".join(parts) + "."
    )


def corrector_table(verdicts: list[dict[str, Any]]) -> Table:
    body = [
        [
            v["setting"],
            v["plain"],
            v["difference"]["exact"],
            interval_text(v["difference"]["trained"]),
            v["verdict"],
        ]
        for v in verdicts
    ]
    return Table(
        "Correctors against their plain sampler at the same steps (TV to the language)",
        [
            "corrector setting",
            "plain setting",
            "TV difference, exact denoiser",
            "TV difference, trained (paired by seed)",
            "verdict (trained)",
        ],
        body,
        note="Differences are corrector minus plain: negative means the corrector's samples "
        "are closer to the language. Same steps means the same model calls: both call the "
        "network once per step.",
    )


def nearest(row: dict[str, Any], candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    return min(
        candidates, key=lambda c: abs(c["nfe_per_token"] - row["nfe_per_token"]), default=None
    )


def eb_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The EB settings with each paired against the threshold setting of nearest NFE."""
    thresholds = [r for r in rows if r["sampler_rule"] == "threshold"]
    placed = []
    for row in (r for r in rows if r["sampler_rule"] == "eb"):
        other = nearest(row, thresholds)
        placed.append(
            {
                "setting": row["setting"],
                "threshold": None if other is None else other["setting"],
                "difference": None if other is None else paired(row, other),
            }
        )
    return placed


def eb_table(rows: list[dict[str, Any]]) -> Table:
    """EB beside one token per step and the threshold sampler, by expected NFE per token."""
    shown = [
        r
        for r in rows
        if r["sampler_rule"] in ("eb", "threshold")
        or (
            r["family"] == "mdm"
            and r["sampler_rule"] in ("random", "low_confidence")
            and r["steps"] == 5
        )
    ]
    pairs = {p["setting"]: p for p in eb_rows(rows)}
    body = []
    for r in sorted(shown, key=lambda r: r["nfe_per_token"]):
        pair = pairs.get(r["setting"])
        against = (
            ""
            if pair is None or pair["threshold"] is None
            else (f"{pair['threshold']}: {interval_text(pair['difference']['trained'])}")
        )
        body.append(
            [r["setting"], r["nfe_per_token"], r["exact_nfe_per_token"],
             r["sampler"]["mean"], interval_text(r["trained"]), against]
        )  # fmt: skip
    return Table(
        "EB between one token per step and the threshold sampler (masked family)",
        [
            "setting",
            "NFE/token (trained, expected)",
            "NFE/token (exact denoiser, expected)",
            "TV(q exact denoiser, p)",
            "TV(q trained, p)",
            "EB minus the threshold setting of nearest NFE (trained TV, paired by seed)",
        ],
        body,
        note="Expected NFE: the exact program's expected model calls per row over the "
        "generated positions (a step calls the network while anything is masked); mean over "
        "the seeds for the trained networks. EB at gamma 0 reveals one token per step in an "
        "order read from the predictions: exact with the exact denoiser (a positive control).",
    )
