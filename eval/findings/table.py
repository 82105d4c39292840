"""The findings table of ``index.md`` and of the README, made from an index's rows, so the
README quotes the reports' own words and numbers (``--table`` checks each row's registration
label from git as it prints)::

    python -m eval.findings --table docs/studies/findings-cpu/index.json docs/studies/findings-cpu
"""

from __future__ import annotations

from typing import Any

OVER = 20 * 60  # a finding over this many seconds says why (its design's training work)
COLUMNS = [
    "finding",
    "published claim (source)",
    "measured here (95% intervals)",
    "verdict",
    "registration",
    "wall",
    "report's commit",
]


def verdict_cell(row: dict[str, Any]) -> str:
    return f"**{row['verdict']}**"


def wall_cell(row: dict[str, Any], costs: dict[str, str]) -> str:
    minutes = f"{row['wall_seconds'] / 60:.1f} min"
    if row["wall_seconds"] > OVER and costs.get(row["name"]):
        return f"{minutes} (over 20: {costs[row['name']]})"
    return minutes


def commit_cell(row: dict[str, Any]) -> str:
    """The commit the finding's report was written at (its own, not the index's)."""
    provenance = row.get("provenance") or {}
    commit = provenance.get("git_commit")
    if not commit:
        return "not recorded"
    return f"`{commit[:7]}`" + (" (dirty tree)" if provenance.get("git_dirty") else "")


def findings_table(
    index: dict[str, Any],
    reports: str,
    costs: dict[str, str],
    labels: dict[str, str] | None = None,
) -> str:
    """The markdown table of an index's findings; ``reports`` is the folder (relative to where
    the table is shown) holding each finding's report; ``labels``: each finding's registration
    label as checked now (``eval.findings.preregistered.result_label``), the rows' own
    otherwise."""
    labels = labels or {}
    lines = ["| " + " | ".join(COLUMNS) + " |", "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    for row in index["findings"]:
        claim = row["claim"]
        title = f"[{claim['title']}]({reports}/{row['name']}/report.md)"
        cells = [
            title,
            f"{claim['statement']} ({claim['source']})",
            row["measured"],
            verdict_cell(row),
            labels.get(row["name"], row.get("registration") or "not recorded"),
            wall_cell(row, costs),
            commit_cell(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
