"""A run's metrics: JSON lines on disk, plus accelerate trackers when configured."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from shared import door
from shared.door import append_line, write_atomic
from shared.errors import ConfigError
from shared.strict_json import parse_json

# The longest line a metrics record may be: the project writes records of a few hundred bytes,
# so a longer line is a damaged or foreign file, refused before it is held in memory.
RECORD_LIMIT = 1 << 20


def metric_lines(path: Path) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(line, record) for each line of a metrics file, read one line at a time (a file of any
    size takes one line's memory); the record is None for a blank line and for a last line
    without its newline that does not parse: every record is appended whole with its newline in
    one write, so that is a record a killed run was writing (``drop_after`` rewrites the file
    without it). A run folder may have come from someone else: a line longer than
    ``RECORD_LIMIT`` bytes, or one that is not a JSON object with a whole-number step (when it
    has one), is one line naming the file and line."""
    with door.open_read(path, path.parent) as handle:
        for number, raw in enumerate(iter(lambda: handle.readline(RECORD_LIMIT + 1), b""), 1):
            finished = raw.endswith(b"\n")
            if len(raw) > RECORD_LIMIT and not finished:
                raise ConfigError(
                    f"{path} line {number}: longer than {RECORD_LIMIT:,} bytes, which no metrics "
                    "record is (the file is damaged or not a metrics file of this project)"
                )
            try:
                line = raw.decode("utf-8").removesuffix("\n")
            except UnicodeDecodeError:
                raise ConfigError(
                    f"{path} line {number}: not UTF-8 text (not a metrics file of this project)"
                ) from None
            if not line.strip() or (not finished and not parses(line)):
                yield line, None
                continue
            yield line, metric_record(line, f"{path} line {number}")


def metric_record(line: str, where: str) -> dict[str, Any]:
    """The record of one metrics line, or one line naming ``where`` it is not one."""
    record = parse_json(line, where, allow_nan=True)  # a diverged step logs a NaN loss
    step = record.get("step", 0) if isinstance(record, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
        raise ConfigError(f"{where}: not a metrics record (a JSON object with a whole-number step)")
    return record


def metric_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) for each record of a metrics file (``metric_lines``, less the lines that
    hold none)."""
    return [(line, record) for line, record in metric_lines(path) if record is not None]


def parses(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


class Metrics:
    def __init__(self, path: Path, accelerator: Accelerator):
        self.path, self.accelerator = path, accelerator

    def lines_to_drop(self, step: int) -> int:
        """How many lines ``drop_after(step)`` leaves out (records of later steps, blank lines, a
        record a killed run cut short), read and checked without writing anything: a resume
        asks before its first write. A metrics path that is not a regular file (a folder, a
        FIFO) is refused here, as any damaged record is."""
        if not self.accelerator.is_main_process or not os.path.lexists(self.path):
            return 0
        return sum(
            record is None or record.get("step", 0) > step for _, record in metric_lines(self.path)
        )

    def drop_after(self, step: int) -> int:
        """Drop the records of steps after ``step`` (a resumed run redoes them: after kill -9 the
        log can run ahead of the newest checkpoint). Returns how many lines were dropped. The
        kept lines are copied one at a time into the new file, never all held at once."""
        dropped = self.lines_to_drop(step)
        if dropped:

            def kept(handle) -> None:
                for line, record in metric_lines(self.path):
                    if record is not None and record.get("step", 0) <= step:
                        handle.write(line.encode("utf-8") + b"\n")

            write_atomic(self.path, kept)
        return dropped

    def train_rates(self) -> list[float]:
        """tokens/s of the training records already on disk (a run resumed at its budget trains
        no step, so its summary reports the throughput its earlier invocations measured)."""
        if not self.path.is_file():
            return []
        records = (record for _, record in metric_lines(self.path) if record is not None)
        return [r["tokens_per_s"] for r in records if r.get("kind") == "train"]

    def log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            append_line(self.path, json.dumps(record))
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numeric, step=record.get("step"))
