"""A run's metrics: JSON lines on disk, plus accelerate trackers when configured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator


class Metrics:
    def __init__(self, path: Path, accelerator: Accelerator):
        self.path, self.accelerator = path, accelerator

    def log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numeric, step=record.get("step"))
