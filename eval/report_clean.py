"""Whether a report may call itself clean: its numbers regenerate from the commit it names.

A report is clean when its own code is a commit with no uncommitted changes and every run it
read was trained at that commit, with no uncommitted changes, nothing edited during training
and the same training code as the report's (``shared.training.provenance.why_not_reproducible``).
A run trained before runs recorded their code is of unknown provenance, so a report reading it
is not clean. ``report.json`` holds ``clean`` (with ``reproducible``, the same), the reasons
and each run's provenance; the Markdown says in its first lines when it is not clean and why.
A job asked for a clean report (``--require-clean``) writes it all the same, then refuses in one
line when it is not (``refuse_unless_clean``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared import door
from shared.errors import ConfigError
from shared.training.provenance import read_run_provenance, why_not_reproducible
from shared.training.run_folder import folder_kind, holds_run

# Folders below a job that never hold the runs it read: a run's checkpoints, stored stages.
NOT_RUNS = ("checkpoints", "stages")
# How deep below a job folder its runs lie (``<job>/<language>/seed0/<family>`` is three).
RUN_DEPTH = 4
# How many runs the first lines of a report name before they count the rest.
NAMED_RUNS = 4


def run_folders(folder: Path, depth: int = RUN_DEPTH) -> list[Path]:
    """``folder`` when it holds a run, else the runs below it: links are not followed, and
    checkpoints, stage stores and folders moved aside by ``--overwrite`` are skipped."""
    folder = Path(folder)
    if holds_run(folder) or (folder / "final.json").is_file():
        return [folder]
    if depth == 0 or not folder.is_dir():
        return []
    found = []
    for entry in sorted(folder.iterdir()):
        if (
            entry.is_dir()
            and not entry.is_symlink()
            and entry.name not in NOT_RUNS
            and not entry.name.startswith(".")
            and ".replaced-" not in entry.name
        ):
            found += run_folders(entry, depth - 1)
    return found


def run_entry(folder: Path, report_out: Path, commit: str | None) -> dict[str, Any]:
    """One run's line of ``runs_provenance``: where it is, what it recorded, why it is not
    reproducible from ``commit`` (empty when it is). An imported checkpoint was not trained by
    this project: it is listed, and judged only for what was trained on it here."""
    imported = folder_kind(folder) == "import"
    try:
        record = read_run_provenance(folder)
    except ConfigError as damaged:  # the report is still written, and says so
        record, reasons = None, [f"its record cannot be read ({damaged})"]
    else:
        reasons = [] if imported and record is None else why_not_reproducible(record, commit)
    segments = (record or {}).get("segments", [])
    return {
        "run": shown_path(folder, report_out),
        "imported": imported,
        "recorded": record is not None,
        "segments": [{k: v for k, v in s.items() if k != "code"} for s in segments],
        "mixed": (record or {}).get("mixed"),
        "init_from": ((record or {}).get("init_from") or {}).get("checkpoint"),
        "not_reproducible_because": reasons,
    }


def shown_path(folder: Path, report_out: Path) -> str:
    """``folder`` relative to the report's folder or its parent when it lies below either."""
    for base in (report_out, report_out.parent):
        try:
            return Path(folder).resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return str(folder)


def runs_provenance(roots: list[Path], report_out: Path, commit: str | None) -> list[dict]:
    """Every run under ``roots`` (each a run or a job folder), once each."""
    folders = {f.resolve(): f for root in roots for f in run_folders(root)}
    return [run_entry(folder, report_out, commit) for folder in folders.values()]


def not_clean_because(code: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """Why a report with its own ``code`` state (``eval.provenance``) that read ``runs`` is not
    clean, one line a reason; [] when it is."""
    reasons = []
    if code.get("git_commit") is None:
        reasons.append("this report was written outside a git checkout (no commit to name)")
    elif code.get("git_dirty") is not False:
        reasons.append("this report was written with uncommitted changes")
    for run in runs:
        if run["not_reproducible_because"]:
            reasons.append(f"run {run['run']}: " + "; ".join(run["not_reproducible_because"]))
    return reasons


def first_lines(code: dict[str, Any], runs: list[dict[str, Any]], reasons: list[str]) -> str:
    """What the report says before anything else when it is not clean ("" when it is)."""
    if not reasons:
        return ""
    commit = str(code.get("git_commit"))[:7]
    other = [run for run in runs if run["not_reproducible_because"]]
    lines = [f"**Not clean: these numbers may not regenerate from commit `{commit}`.**"]
    if other:
        named = "; ".join(
            f"`{run['run']}` ({', '.join(run['not_reproducible_because'])})"
            for run in other[:NAMED_RUNS]
        )
        more = len(other) - NAMED_RUNS
        lines.append(
            f"{len(other)} of {len(runs)} runs were trained under other code: {named}"
            + (f" and {more} more" if more > 0 else "")
            + "."
        )
    own = [reason for reason in reasons if not reason.startswith("run ")]
    lines += [reason[0].upper() + reason[1:] + "." for reason in own]
    lines.append("(`report.json`: `clean: false`, `reproducible: false`; the reasons are listed.)")
    return " ".join(lines)


def refuse_unless_clean(report_json: Path) -> None:
    """The check behind ``--require-clean``: refuse, in one line, a written report that is not
    clean, or that predates the rule (it has no ``clean`` to trust)."""
    data = door.read_json_object(report_json, root=report_json.parent)
    if not isinstance(data.get("clean"), bool):
        raise ConfigError(
            f"{report_json} records no clean flag (written before reports listed "
            "the runs they read); write it again"
        )
    reasons = [str(reason) for reason in data.get("not_clean_because") or []]
    if not data["clean"]:
        more = len(reasons) - NAMED_RUNS
        named = "; ".join(reasons[:NAMED_RUNS]) + (f"; and {more} more" if more > 0 else "")
        raise ConfigError(f"{report_json} is not clean: {named or 'no reason recorded'}")
