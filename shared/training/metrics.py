"""A run's metrics: JSON lines on disk, plus accelerate trackers when configured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from shared import door
from shared.door import append_line, write_atomic
from shared.errors import ConfigError
from shared.strict_json import parse_json


def metric_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) for each record of a metrics file. A run folder may have come from
    someone else: a line that is not a JSON object with a whole-number step (when it has one)
    is one line naming the file and line. The one exception is a last line without its newline
    that does not parse: every record is appended whole with its newline in one write, so that
    is a record a killed run was writing, and it is left out (``drop_after`` then rewrites the
    file without it)."""
    try:
        text = door.read_bytes(path, path.parent).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (not a metrics file of this project)") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n") and not parses(lines[-1]):
        lines = lines[:-1]
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path} line {number}", allow_nan=True)
        step = record.get("step", 0) if isinstance(record, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            raise ConfigError(
                f"{path} line {number}: not a metrics record (a JSON object with a whole-number "
                "step)"
            )
        records.append((line, record))
    return records


def parses(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


class Metrics:
    def __init__(self, path: Path, accelerator: Accelerator):
        self.path, self.accelerator = path, accelerator

    def drop_after(self, step: int) -> int:
        """Drop the records of steps after ``step`` (a resumed run redoes them: after kill -9 the
        log can run ahead of the newest checkpoint). Returns how many were dropped."""
        if not self.accelerator.is_main_process or not self.path.is_file():
            return 0
        lines = door.read_text(self.path, self.path.parent).splitlines()
        kept = [line for line, record in metric_records(self.path) if record.get("step", 0) <= step]
        if len(kept) != len(lines):
            write_atomic(self.path, "".join(line + "\n" for line in kept))
        return len(lines) - len(kept)

    def train_rates(self) -> list[float]:
        """tokens/s of the training records already on disk (a run resumed at its budget trains
        no step, so its summary reports the throughput its earlier invocations measured)."""
        if not self.path.is_file():
            return []
        records = [record for _, record in metric_records(self.path)]
        return [r["tokens_per_s"] for r in records if r.get("kind") == "train"]

    def log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            append_line(self.path, json.dumps(record))
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numeric, step=record.get("step"))
