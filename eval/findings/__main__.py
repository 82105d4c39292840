"""Reproduce the field's published AR-vs-diffusion findings, each with a verdict.

    python -m eval.findings --scale smoke --out runs/findings-smoke   # plumbing, ~1 min (CI)
    python -m eval.findings --scale cpu --out runs/findings-cpu       # each finding <= 15 min
    python -m eval.findings --scale gpu --only reversal pathstar      # closer to the papers

Every finding writes ``<out>/<finding>/report.md`` (+ report.json, figures) whose verdict rule is
stated before its numbers; ``<out>/index.md`` (+ index.json) has one row per finding, each with
its report's commit, dirty flag, source and registration hashes (``--reindex OUT`` rebuilds it
from the stored reports, running nothing). Trained
runs and measured stages are reused on a rerun of the same code and settings (``--force`` redoes
them; a folder made by other code or settings is moved aside, never reused); SIGTERM/Ctrl-C
stops after a checkpoint, exits 75 and a rerun continues. ``--out`` is new, empty or a findings
folder (``eval.experiments.job_folder``): a folder of a user's own files is never written into.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from eval.experiments.job_folder import check_job_folder, claim_job_folder, refuse_links_in_job
from eval.experiments.stages import run_stoppable
from eval.findings.common import (
    SCALES,
    FindingResult,
    Job,
    job_stamp,
    row_provenance,
)
from eval.findings.index import write_index
from eval.findings.preregistered import result_label
from eval.findings.registration import fresh_job_folder
from eval.findings.registry import FINDINGS
from eval.findings.table import findings_table
from eval.provenance import PROJECT_ROOT
from shared.cli_args import CommandParser
from shared.door import read_json_file, write_atomic
from shared.errors import ConfigError, report_user_errors
from shared.faults import StopRequest
from shared.files import use_cache_root


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", choices=SCALES, default="cpu")
    parser.add_argument("--only", nargs="+", default=None, metavar="FINDING", help="a subset")
    parser.add_argument("--out", default=None, help="output folder (default runs/findings-SCALE)")
    parser.add_argument("--force", action="store_true", help="retrain and remeasure everything")
    parser.add_argument("--cache-dir", default=None, help="tokenizer/data cache of every run")
    parser.add_argument(
        "--num-threads", type=int, default=0, help="torch CPU threads per run; 0 = default"
    )
    parser.add_argument(
        "--table",
        nargs=2,
        metavar=("INDEX_JSON", "REPORTS"),
        help="print the README's findings table from a committed index.json (REPORTS: the "
        "folder of its reports, as the README links it, which must hold every finding's "
        "<name>/report.md) and exit",
    )
    parser.add_argument(
        "--reindex",
        metavar="OUT",
        help="rebuild OUT/index.md and OUT/index.json from the findings' stored result.json and "
        "report.json (each row with its report's provenance); trains and measures nothing",
    )
    args = parser.parse_args(argv)
    if args.table:
        return report_user_errors(lambda: print_table(*args.table))
    if args.reindex:
        return report_user_errors(lambda: reindex(Path(args.reindex)))
    out = Path(args.out or f"runs/findings-{args.scale}")
    return run_stoppable(lambda stop: run_findings(args, out, stop))


def run_findings(args: argparse.Namespace, out: Path, stop: StopRequest) -> None:
    """Run every finding asked for into its folder ``out/<name>``, then write the index. The
    settings are checked first, then ``out`` is claimed as a findings folder and every finding's
    folder is checked for ownership, so a refusal writes nothing."""
    names = args.only or list(FINDINGS)
    unknown = [name for name in names if name not in FINDINGS]
    if unknown:
        raise ConfigError(f"unknown finding(s) {unknown}; valid: {list(FINDINGS)}")
    extra = {"num_threads": args.num_threads} if args.num_threads else {}
    if args.cache_dir:
        extra["cache_dir"] = args.cache_dir
        use_cache_root(args.cache_dir)  # the findings' own row loading goes there too
    # --force redoes the findings asked for (each folder moved aside), never the whole folder
    lock = claim_job_folder(out, args.force, "findings", keep_own=True)
    try:
        for name in names:
            check_job_folder(out / name, args.force, "findings job")
        for name in names:
            run_finding(name, args, out, stop, extra)
        results = [stored(out, name) for name in FINDINGS if (out / name / "result.json").is_file()]
        paths = write_index(out, args.scale, results, costs())
        print(f"index: {paths['markdown']}")
    finally:
        lock.release()


def run_finding(
    name: str, args: argparse.Namespace, out: Path, stop: StopRequest, extra: dict[str, Any]
) -> None:
    """One finding, in its own folder below ``out``, and its result.json."""
    started = time.perf_counter()
    finding = FINDINGS[name]
    fresh_job_folder(out / name, job_stamp(finding, args.scale), args.force, root=out)
    job = Job(args.scale, out / name, args.force, stop, extra)
    result = finding.run(finding.settings[args.scale], job)
    result.wall_seconds = time.perf_counter() - started
    write_atomic(out / name / "result.json", json.dumps(_row(result), indent=2), root=out)
    label = f" ({result.registration})" if result.registration else ""
    print(f"[{name}] {result.verdict}{label}: {result.measured} ({result.wall_seconds:.0f} s)")


def print_table(index_path: str, reports: str) -> None:
    """``--table``: the findings table of an index.json; an index that is missing or not one,
    or a REPORTS folder that does not hold every finding's report the table links to, is one
    line."""
    path = Path(index_path)
    if not path.is_file():
        raise FileNotFoundError(f"--table {path}: no such file (give a findings index.json)")
    try:
        index = read_json_file(path, allow_nan=True)
    except ConfigError as error:
        raise ConfigError(f"--table {error}; give a findings index.json") from None
    try:
        table = findings_table(index, reports, costs(), checked_labels(index))
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ConfigError(
            f"--table {path}: not a findings index ({type(error).__name__}: {error}); give the "
            "index.json that python -m eval.findings writes"
        ) from None
    missing = missing_report(index, Path(reports))
    if missing:
        raise FileNotFoundError(
            f"--table REPORTS {reports}: {missing}, so the table's links would be broken; give "
            "the folder that holds each finding's <name>/report.md (as the README links it, "
            "from where the table is shown)"
        )
    print(table)


def checked_labels(index: dict, root: Path = PROJECT_ROOT) -> dict[str, str]:
    """Each row's registration label, checked now from the git history of ``root`` (never the
    label the index stored)."""
    return {row["name"]: result_label(row, root).label for row in index["findings"]}


def missing_report(index: dict, reports: Path) -> str | None:
    """What the table would link to that is not there (the REPORTS folder, or the first
    finding's report.md it lacks), in words; None when every link resolves."""
    if not reports.is_dir():
        return "no such folder" if not reports.exists() else "not a folder"
    for row in index["findings"]:
        report = reports / row["name"] / "report.md"
        if not report.is_file():
            return f"it has no {row['name']}/report.md"
    return None


def costs() -> dict[str, str]:
    return {name: finding.cost for name, finding in FINDINGS.items()}


def _row(result: FindingResult) -> dict:
    """The result as ``result.json`` keeps it (the claim is the finding's own; the numbers are in
    the report)."""
    return {k: v for k, v in dataclasses.asdict(result).items() if k not in ("claim", "numbers")}


def stored(out: Path, name: str) -> FindingResult:
    """A finding's last result as its folder holds it (so the index covers every finding run
    into ``out``, not only this invocation's), its report where the folder now is and its
    provenance from that report (a result written before rows carried their own)."""
    row = read_json_file(out / name / "result.json", root=out, allow_nan=True)
    result = FindingResult(claim=FINDINGS[name].claim, **row)
    report = out / name / "report.json"
    if report.is_file():
        result.report = str(out / name / "report.md")
        result.provenance = row_provenance(read_json_file(report, root=out, allow_nan=True))
    return result


def reindex(out: Path) -> None:
    """``--reindex``: the index of the findings stored in ``out``, rebuilt without running any;
    a folder with no stored finding, or one holding a symbolic link, is one line."""
    refuse_links_in_job(out)
    names = [name for name in FINDINGS if (out / name / "result.json").is_file()]
    if not names:
        raise ConfigError(
            f"--reindex {out}: no finding's result.json there (give the --out of a findings run)"
        )
    scales = {
        read_json_file(out / n / "result.json", root=out, allow_nan=True)["scale"] for n in names
    }
    if len(scales) != 1:
        raise ConfigError(f"--reindex {out}: findings of several scales {sorted(scales)}")
    results = [stored(out, name) for name in names]
    paths = write_index(out, scales.pop(), results, costs(), reindexed=True)
    print(f"index: {paths['markdown']} (rebuilt from {len(results)} stored reports)")


if __name__ == "__main__":
    sys.exit(main())
