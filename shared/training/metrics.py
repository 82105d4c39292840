"""A run's metrics: JSON lines on disk, plus accelerate trackers when configured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from shared.files import append_line, write_atomic


class Metrics:
    def __init__(self, path: Path, accelerator: Accelerator):
        self.path, self.accelerator = path, accelerator

    def drop_after(self, step: int) -> int:
        """Drop the records of steps after ``step`` (a resumed run redoes them: after kill -9 the
        log can run ahead of the newest checkpoint). Returns how many were dropped."""
        if not self.accelerator.is_main_process or not self.path.is_file():
            return 0
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
        if len(kept) != len(lines):
            write_atomic(self.path, "".join(line + "\n" for line in kept))
        return len(lines) - len(kept)

    def train_rates(self) -> list[float]:
        """tokens/s of the training records already on disk (a run resumed at its budget trains
        no step, so its summary reports the throughput its earlier invocations measured)."""
        if not self.path.is_file():
            return []
        records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [r["tokens_per_s"] for r in records if r.get("kind") == "train"]

    def log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            append_line(self.path, json.dumps(record))
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numeric, step=record.get("step"))
