"""What every finding shares: its published claim, its result row for the index and the report it
writes (the index page over all of them: ``eval.findings.index``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eval.findings.registration import (
    EXPLORATORY,
    JOB_STAMP,
    registration,
    registration_hash,
    registration_text,
)
from eval.findings.verdicts import RULES, LearnedCheck, learned_gate, one_seed_guard
from eval.provenance import code_state
from eval.report import Report, Table
from shared.door import read_json_file
from shared.faults import StopRequest

SCALES = ("smoke", "cpu", "gpu")


@dataclass(frozen=True)
class Claim:
    """A published finding as the literature states it."""

    title: str
    statement: str
    source: str


@dataclass
class FindingResult:
    """One row of the index: what was measured, with its interval, and the verdict."""

    name: str
    claim: Claim
    measured: str  # the headline measurement with its 95% interval, as text
    verdict: str
    rule: str  # the rule's text, as in the report
    scale: str
    wall_seconds: float = 0.0
    report: str = ""  # path of report.md, relative to the index
    registration: str = ""  # pre-registered or exploratory (eval.findings.registration)
    numbers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # the code that wrote the row's report: commit, dirty flag, source hash, registration hash,
    # and the commit whose job trained the runs it was rendered from (``row_provenance``)
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """Where and how a finding runs: its scale, its folder, whether to redo finished work, the
    stop request of the command, and training settings that leave results unchanged
    (``cache_dir``, ``num_threads``), added to every run."""

    scale: str
    out: Path
    force: bool = False
    stop: StopRequest | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """A finding: its claim, its settings per scale, and the function that measures it."""

    name: str
    claim: Claim
    settings: dict[str, Any]  # scale -> the settings object the runner takes
    run: Callable[[Any, Job], FindingResult]  # (settings of the job's scale, job)
    gpu_wall: str  # expected wall time of the gpu scale, as documented
    # What decides the verdict besides the settings (band, thresholds, learned checks), declared
    # before any run and hashed into the registration.
    rule: dict[str, Any] = field(default_factory=dict)
    gpu_budget: str = ""  # what the gpu scale trains, for a finding whose models did not learn
    cost: str = ""  # the cpu scale's training work, said where it takes over 20 minutes
    # settings -> {run name: (preset, overrides)}: every run the finding trains, as run() starts
    # it (without the job's cache and thread settings); resolved and hashed into the registration
    runs: Callable[[Any], dict[str, tuple[str, dict[str, Any]]]] | None = None
    # modules besides verdicts.py, common.py and the finding's own whose code decides its verdict
    judged_by: tuple[str, ...] = ()


def job_stamp(finding: Finding, scale: str) -> dict[str, Any]:
    """What a finding's folder must have been made by to be reused (this code, these settings
    and rule: ``REUSE_KEYS``), the commit that started its job and when (UTC): the moment its
    registration must precede to count as pre-registered (``eval.findings.preregistered``). A
    reused job keeps the stamp it was started with (``fresh_job_folder``)."""
    state = code_state()
    return {
        "source_hash": state["source_hash"],
        "registration": registration_hash(finding, scale),
        "git_commit": state["git_commit"],
        "git_dirty": state["git_dirty"],
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def runs_origin(out: Path, state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Who trained the runs in ``out`` (its job stamp: the commit that started the job, and
    when), and the report's sentence when that is another commit than ``state``'s: a re-render
    from stored runs, which keeps the runs' commit and start."""
    path = out / JOB_STAMP
    stamp = read_json_file(path) if path.is_file() else {}
    origin = {key: stamp.get(key) for key in ("git_commit", "git_dirty", "started")}
    if not stamp or origin["git_commit"] == state["git_commit"]:
        return origin, ""
    made_by = f"commit `{origin['git_commit']}`" if origin["git_commit"] else "an unrecorded commit"
    return origin, (
        f"**Re-rendered from stored runs.** The runs and measured stages were made by {made_by} "
        f"(the same source hash `{stamp['source_hash']}`); this report was written at commit "
        f"`{state['git_commit']}` (its provenance, below)."
    )


def start_report(
    finding: Finding, scale: str, out: Path, settings: Any, rules: list[str], preface: str = ""
):
    """A finding's report with its claim and its rules written before any number (``preface``,
    e.g. that its results are not comparable with the publication's, goes first)."""
    report = Report(
        f"Finding: {finding.claim.title} (scale `{scale}`)",
        out,
        config={
            "finding": finding.name,
            "scale": scale,
            "settings": _plain(settings),
            "rule": finding.rule,
        },
        seeds={"train": list(getattr(settings, "seeds", (0,)))},
    )
    state = code_state()
    status = registration(finding, scale, state)
    report.results["registration"] = status
    report.results["runs_made_by"], rerendered = runs_origin(out, state)
    if rerendered:
        report.text(rerendered)
    if preface:
        report.text(preface)
    report.text(
        f"**Published claim.** {finding.claim.statement} ({finding.claim.source}) "
        f"The `gpu` scale of this finding takes {finding.gpu_wall} (an estimate).\n\n"
        + registration_text(status)
        + "\n\n"
        + "\n\n".join(rules)
    )
    return report


def finish_report(
    report: Report,
    finding: Finding,
    scale: str,
    *,
    measured: str,
    verdict: str,
    rule: str,
    checks: list[LearnedCheck],
    numbers: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> FindingResult:
    """Apply the learned gate to the comparison's ``verdict``, write the verdict section and the
    report; returns the finding's row for the index."""
    guarded, seed_notes = one_seed_guard(verdict, len(report.seeds.get("train", ())))
    gated, gate_notes = learned_gate(guarded, checks, finding.gpu_budget or finding.gpu_wall)
    status = report.results["registration"]["status"]
    result = FindingResult(
        finding.name,
        finding.claim,
        measured,
        gated,
        rule,
        scale,
        numbers=(numbers or {}) | {"comparison_verdict": verdict},
        notes=seed_notes + gate_notes + (notes or []),
        registration=status,
    )
    label = " (exploratory run)" if status == EXPLORATORY else ""
    report.table(
        Table(
            "Learned checks (the gate)",
            ["model", "check", "measured", "passed"],
            [[c.model, c.check, c.measured, "yes" if c.passed else "NO"] for c in checks],
        )
    )
    report.text(
        f"## Verdict: **{gated}**{label}\n\nMeasured: {measured}."
        + "".join(f"\n\n{note}" for note in result.notes)
    )
    report.results.update(
        {
            "verdict": gated,
            "comparison_verdict": verdict,
            "measured": measured,
            "checks": [_plain(c) for c in checks],
        }
    )
    report.results.setdefault("numbers", {}).update(result.numbers)
    result.report = str(report.write()["markdown"])
    result.provenance = row_provenance(read_json_file(report.out / "report.json"))
    return result


def row_provenance(report: dict[str, Any]) -> dict[str, Any]:
    """An index row's provenance from its finding's ``report.json``: the commit, dirty flag and
    source hash that wrote the report and when, its registration status and hash, and the commit
    whose job trained the runs and when it started (None where the report predates that
    record)."""
    prov, results = report["provenance"], report["results"]
    registered = results.get("registration", {})
    runs = results.get("runs_made_by", {})
    return {
        "git_commit": prov["git_commit"],
        "git_dirty": prov["git_dirty"],
        "source_hash": prov["source_hash"],
        "created": prov.get("created"),
        "registration_status": registered.get("status"),
        "registration_hash": registered.get("hash"),
        "runs_commit": runs.get("git_commit"),
        "runs_started": runs.get("started"),
    }


def rule_text(*names: str) -> list[str]:
    return [RULES[name] for name in names]


def _plain(value: Any) -> Any:
    return asdict(value) if hasattr(value, "__dataclass_fields__") else value
