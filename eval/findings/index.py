"""The findings index (``index.md`` and ``index.json``): one row per finding with its report's
provenance and its registration label, recomputed from git each time the index is written
(``eval.findings.preregistered.result_label``), never copied from a report or an older index."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eval.findings.common import FindingResult
from eval.findings.preregistered import result_label
from eval.findings.table import findings_table
from eval.provenance import PROJECT_ROOT, provenance
from shared import door
from shared.door import write_atomic


def labelled(row: dict[str, Any], root: Path) -> dict[str, Any]:
    """``row`` with its registration label and the evidence for it (the registration commit and
    its time, the run's start, why), checked now from the git history of ``root``."""
    found = result_label(row, root)
    evidence = {
        "label": found.label,
        "why": found.why,
        "registration_commit": found.registration_commit,
        "registered_at": found.registered_at.isoformat() if found.registered_at else None,
    }
    return row | {"registration": found.label, "registration_check": evidence}


def write_index(
    out: Path,
    scale: str,
    results: list[FindingResult],
    costs: dict[str, str],
    reindexed: bool = False,
    root: Path = PROJECT_ROOT,
) -> dict[str, Path]:
    """``index.md`` and ``index.json``: one row per finding (``costs``: each finding's training
    work, said where it took over 20 minutes), each with its report's provenance and its
    registration label checked from the git history of ``root``; ``reindexed``: rebuilt from
    the stored reports, nothing run."""
    rows = [labelled(asdict(r), root) for r in results]
    for row in rows:
        row["report"] = os.path.relpath(row["report"], out) if row["report"] else ""
    prov = provenance()
    written = "Index rebuilt from the stored reports" if reindexed else "Index written"
    text = "\n".join(
        [
            f"# Findings (scale `{scale}`)",
            "",
            findings_table({"findings": rows}, ".", costs),
            "",
            "Each report states its verdict rule before its numbers. The registration column is "
            "checked from git when the index is written: *pre-registered* only where the commit "
            "that registered the hash a finding ran under is an ancestor of the commit its runs "
            "were trained at and older than their start (docs/findings.md). At scale `smoke` "
            "the runs are far too short for the verdicts to mean anything: smoke checks the "
            "plumbing.",
            "",
            provenance_table(rows),
            "",
            f"{written} at git commit `{prov['git_commit']}`"
            + (" (with uncommitted changes)" if prov["git_dirty"] else "")
            + f" (each report records its own, above); machine: {prov['machine']['cpu']} "
            f"({prov['machine']['cpu_count']} CPUs), GPU: {prov['machine']['gpu']}; "
            f"created {prov['created']}",
            "",
        ]
    )
    paths = {"markdown": out / "index.md", "json": out / "index.json"}
    door.make_folders(out, out)
    write_atomic(paths["markdown"], text, root=out)
    data = {"scale": scale, "provenance": prov, "findings": rows}
    write_atomic(paths["json"], json.dumps(data, indent=2, default=str), root=out)
    return paths


def provenance_table(rows: list[dict[str, Any]]) -> str:
    """Each row's code: the commit that wrote its report, whether the tree was dirty, the
    source and registration hashes, the commit that trained its runs, and why its registration
    label is what it is."""
    lines = [
        "| finding | report's commit | dirty | source hash | registration hash | runs' commit "
        "| registration checked |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        p = row.get("provenance") or {}
        cells = [p.get(k) for k in ("git_commit", "git_dirty", "source_hash")]
        cells += [p.get("registration_hash"), p.get("runs_commit") or "not recorded"]
        check = row.get("registration_check") or {}
        cells.append(f"{check.get('label', '')}: {check.get('why', '')}")
        lines.append("| " + " | ".join([row["name"], *(f"{c}" for c in cells)]) + " |")
    return "\n".join(lines)
