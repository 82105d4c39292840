"""Reports: every number with its provenance, written as ``report.json`` and ``report.md``.

A report holds sections of results. Likelihood numbers carry the data protocol they were measured
under, and a comparison table refuses to put numbers from different protocols side by side
(packed vs padded, another sequence length, tokenizer or corpus change the numbers more than the
models do). Plots are PNG files next to the markdown, which embeds them by relative path. The
provenance each report records (code, machine, versions, seeds) is ``eval.provenance``'s; the
runs it read (``Report.read_runs``) are listed with the code that trained each, and the report
calls itself clean only when they and it share one committed code (``eval.report_clean``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.provenance import provenance
from eval.report_clean import first_lines, not_clean_because, runs_provenance
from shared import door
from shared.door import write_atomic

# Protocol fields that must agree before two likelihoods may share a table.
PROTOCOL_KEYS = ("corpus_fingerprint", "protocol", "seq_len", "tokenizer")


class ProtocolMismatch(ValueError):
    """Numbers measured under different data protocols were put in one comparison."""


def protocol_key(protocol: dict[str, Any]) -> dict[str, Any]:
    key = {name: protocol.get(name) for name in PROTOCOL_KEYS}
    if isinstance(key["tokenizer"], dict):
        key["tokenizer"] = key["tokenizer"].get("fingerprint")
    return key


def check_same_protocol(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The shared protocol of named results, or ProtocolMismatch naming what differs."""
    keys = {name: protocol_key(row["protocol"]) for name, row in rows.items()}
    names = list(keys)
    reference = keys[names[0]]
    for name in names[1:]:
        differing = [k for k in PROTOCOL_KEYS if keys[name][k] != reference[k]]
        if differing:
            details = ", ".join(
                f"{k}: {names[0]}={reference[k]!r} vs {name}={keys[name][k]!r}" for k in differing
            )
            raise ProtocolMismatch(
                f"refusing to compare {names[0]!r} and {name!r}: measured under different data "
                f"protocols ({details}); evaluate both under one protocol first"
            )
    return reference


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""

    def markdown(self) -> str:
        def cell(value: Any) -> str:
            if isinstance(value, float):
                if not math.isfinite(value):
                    return str(value)
                if abs(value) >= 1000:
                    return f"{value:,.0f}"
                return f"{value:.4g}"
            if isinstance(value, int):
                return f"{value:,}"
            return str(value)

        lines = [
            f"### {self.title}",
            "",
            "| " + " | ".join(self.columns) + " |",
            "| " + " | ".join("---" for _ in self.columns) + " |",
        ]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)


@dataclass
class Report:
    """Collects tables, free text, plots and raw results, then writes report.md + report.json."""

    title: str
    out: Path
    config: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, Any] = field(default_factory=dict)
    blocks: list[tuple[str, Any]] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    # the folder the command claimed (a job's --out), when ``out`` lies below it: folders
    # between the two are made, and files written, without following a link
    root: Path | None = None
    # runs (or job folders holding runs) the numbers come from, besides those under ``out``:
    # every job trains its runs in its own folder, so the report's folder is always read
    runs: list[Path] = field(default_factory=list)

    def _folder(self) -> Path:
        """``out``, made through the door below ``root`` (or ``out`` itself)."""
        return door.make_folders(self.out, self.root if self.root is not None else self.out)

    def read_runs(self, *folders: Path) -> None:
        """Name runs this report reads, or job folders whose runs it reads: each is listed with
        the code that trained it, and judged before the report may call itself clean."""
        self.runs.extend(Path(folder) for folder in folders)

    def text(self, markdown: str) -> None:
        self.blocks.append(("text", markdown))

    def table(self, table: Table) -> None:
        self.blocks.append(("table", table))

    def likelihood_table(self, title: str, rows: dict[str, dict[str, Any]]) -> Table:
        """A side-by-side likelihood table; every row needs ``protocol`` and the numbers of
        ``eval.likelihood.Estimate.as_dict``. Refuses rows from different protocols."""
        shared = check_same_protocol(rows)
        table = Table(
            title,
            [
                "model",
                "estimate",
                "nats/token",
                "95% interval",
                "perplexity",
                "bits/byte",
                "tokens",
            ],
            [
                [
                    name,
                    row["kind"],
                    row["nats_per_token"],
                    "[{:.4f}, {:.4f}]".format(*row["nats_per_token_ci95"]),
                    row["perplexity"],
                    row["bits_per_byte"],
                    row["tokens"],
                ]
                for name, row in rows.items()
            ],
            note=f"Protocol: {json.dumps(shared)}",
        )
        self.table(table)
        self.results.setdefault("likelihood", {})[title] = rows
        return table

    def plot(self, name: str, figure, caption: str) -> Path:
        """Save a matplotlib figure as ``<out>/<name>.png`` and embed it."""
        path = self._folder() / f"{name}.png"
        # whole or not at all, as the report's other files (savefig takes an open file)
        write_atomic(
            path,
            lambda handle: figure.savefig(handle, format="png", dpi=120, bbox_inches="tight"),
            root=self.root,
        )
        import matplotlib.pyplot as plt

        plt.close(figure)
        self.blocks.append(("plot", (path.name, caption)))
        return path

    def to_json(self) -> dict[str, Any]:
        prov = provenance(self.seeds)
        runs = runs_provenance([self.out, *self.runs], self.out, prov["git_commit"])
        reasons = not_clean_because(prov, runs)
        return {
            "title": self.title,
            # clean: the numbers regenerate from the commit named below (eval.report_clean)
            "clean": not reasons,
            "reproducible": not reasons,
            "not_clean_because": reasons,
            "provenance": prov,
            "runs_provenance": runs,
            "config": self.config,
            "results": self.results,
            "tables": [
                {"title": t.title, "columns": t.columns, "rows": t.rows, "note": t.note}
                for kind, t in self.blocks
                if kind == "table"
            ],
            "plots": [p[0] for kind, p in self.blocks if kind == "plot"],
        }

    def markdown(self, data: dict[str, Any]) -> str:
        parts = [f"# {self.title}", ""]
        warning = first_lines(
            data["provenance"], data["runs_provenance"], data["not_clean_because"]
        )
        if warning:
            parts += [warning, ""]
        for kind, value in self.blocks:
            if kind == "text":
                parts.append(value)
            elif kind == "table":
                parts.append(value.markdown())
            else:
                name, caption = value
                parts.append(f"![{caption}]({name})\n\n*{caption}*")
            parts.append("")
        prov = data["provenance"]
        parts += [
            "## Provenance",
            "",
            f"- git commit: `{prov['git_commit']}`"
            + (" with uncommitted changes" if prov["git_dirty"] else "")
            + f" (source hash `{prov['source_hash']}`); created {prov['created']}",
            f"- machine: {prov['machine']['cpu']} ({prov['machine']['cpu_count']} CPUs, "
            f"{prov['machine']['torch_threads']} torch threads), GPU: {prov['machine']['gpu']}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if v),
            f"- seeds: {json.dumps(prov['seeds'])}",
            *run_lines(data["runs_provenance"]),
            "",
        ]
        return "\n".join(parts)

    def write(self) -> dict[str, Path]:
        self._folder()
        data = self.to_json()
        paths = {"json": self.out / "report.json", "markdown": self.out / "report.md"}
        strict, non_finite = finite_or_null(data)
        if non_finite:
            strict["non_finite"] = non_finite
        write_atomic(paths["json"], json.dumps(strict, indent=2, allow_nan=False), root=self.root)
        write_atomic(paths["markdown"], self.markdown(data), root=self.root)
        return paths


def run_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The provenance section's line per run read: the code that trained it, and whether the
    report's commit regenerates it."""
    lines = []
    for run in runs:
        trained = ", ".join(
            f"steps {s['from_step']}-{s['to_step']} "
            + ("unknown" if s.get("unknown") else f"at `{str(s.get('git_commit'))[:7]}`")
            + (" with uncommitted changes" if s.get("git_dirty") else "")
            + (f" (code key `{s['code_key']}`)" if s.get("code_key") else "")
            for s in run["segments"]
        )
        judged = "; ".join(run["not_reproducible_because"]) or "reproducible from this commit"
        kind = "imported" if run["imported"] else "trained"
        lines.append(f"- run `{run['run']}`: {kind} {trained or 'with no record'}; {judged}")
    return lines


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot put {type(value).__name__} in report.json")


def finite_or_null(value: Any, where: str = "") -> tuple[Any, dict[str, str]]:
    """``value`` as strict JSON data (RFC 8259 has no NaN or Infinity): every non-finite float
    becomes null, and the map says where (a path such as ``results.rows[2].kl``) and what it was
    ("inf", "-inf" or "nan"), so a reader never mistakes the null for a missing number."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value, {}
        return None, {where: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, dict):
        out, reasons = {}, {}
        for key, item in value.items():
            out[str(key)], found = finite_or_null(item, f"{where}.{key}" if where else str(key))
            reasons |= found
        return out, reasons
    if isinstance(value, (list, tuple)):
        pairs = [finite_or_null(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return [item for item, _ in pairs], {k: v for _, r in pairs for k, v in r.items()}
    if value is None or isinstance(value, (str, int, bool)):
        return value, {}
    return finite_or_null(_json_default(value), where)


def frontier_figure(
    curves: dict[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
):
    """One line per curve (e.g. a sampler across step counts), points sorted by x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for label, points in curves.items():
        ordered = sorted(points)
        marker = "*" if len(ordered) == 1 else "o"
        axis.plot(
            [x for x, _ in ordered],
            [y for _, y in ordered],
            marker=marker,
            label=label,
            markersize=10 if marker == "*" else 5,
        )
    if logx:
        axis.set_xscale("log")
    values = [y for points in curves.values() for _, y in points if y > 0]
    if values and max(values) / min(values) > 20:  # judge perplexities span decades
        axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return figure
