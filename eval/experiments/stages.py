"""What every experiment shares: resumable stages cached on disk, training runs that are reused
when finished and resumed when interrupted, and loading a run's checkpoint and validation rows."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shared.checkpoint import load_model_from_checkpoint
from shared.data.corpus import load_corpus
from shared.data.rows import tokenize_corpus
from shared.tokenizer import Tokenizer
from shared.training import new_run, resume_run, train
from shared.training.cli import parse_args

OBJECTIVES = ("ar", "mdm")


class Stages:
    """Stage results stored as JSON, keyed by a hash of the inputs that produced them."""

    def __init__(self, root: Path, force: bool):
        self.root, self.force = root / "stages", force
        self.root.mkdir(parents=True, exist_ok=True)
        self.reused: list[str] = []

    def run(self, name: str, inputs: dict[str, Any], compute: Callable[[], Any]) -> Any:
        key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
        path = self.root / f"{name}.json"
        if path.exists() and not self.force:
            stored = json.loads(path.read_text())
            if stored.get("key") == key:
                print(f"[{name}] reusing the stored result (--force recomputes)")
                self.reused.append(name)
                return stored["result"]
        start = time.perf_counter()
        result = compute()
        elapsed = time.perf_counter() - start
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"key": key, "seconds": elapsed, "result": result}, indent=2, default=float)
        )
        tmp.replace(path)
        print(f"[{name}] done in {elapsed:.1f} s")
        return result


def training_overrides(flags: list[str]) -> dict[str, Any]:
    """The training settings among an experiment's command-line flags (``--max-steps 800`` ->
    ``{"max_steps": 800}``), parsed and checked as ``train.py`` parses them."""
    return parse_args(flags)[1]


def train_or_reuse(
    label: str,
    run_dir: Path,
    preset: str,
    start: dict[str, Any],
    overrides: dict[str, Any],
    force: bool,
) -> dict[str, Any]:
    """Train one run: reuse it if it finished, resume it if it has checkpoints (with
    ``overrides`` applied), else start ``preset`` with ``start`` (the objective and what defines
    the run) plus ``overrides``."""
    final = run_dir / "final.json"
    if final.exists() and not force:
        summary = json.loads(final.read_text())
        if summary.get("finished"):
            print(f"[train {label}] reusing the finished run in {run_dir}")
            summary["reused"] = True
            return summary
    if force and run_dir.exists():
        shutil.rmtree(run_dir)
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
        return train(resume_run(run_dir, preset=preset, **overrides))
    return train(new_run(preset, run_dir, **start, **overrides))


def train_both(
    preset: str, out: Path, overrides: dict[str, Any], budget: str, force: bool
) -> dict[str, dict[str, Any]]:
    """The AR and the MDM run of a comparison, under one token budget or, with ``budget ==
    "flops"``, the MDM under the FLOPs the AR run spent."""
    summaries = {}
    flops_budget: dict[str, Any] = {}
    for objective in OBJECTIVES:
        summaries[objective] = train_or_reuse(
            objective,
            out / objective,
            preset,
            {"objective": objective},
            overrides | flops_budget,
            force,
        )
        if budget == "flops" and objective == "ar":
            # The MDM gets the AR's FLOPs, not its tokens (equal here up to the [MASK] row).
            spent = summaries["ar"]["tokens_seen"] * summaries["ar"]["flops_per_token"]
            flops_budget = {"max_flops": spent}
    return summaries


def load(out: Path, name: str, device: str = "cpu"):
    """(model, tokenizer, state) of the run ``out/name``'s newest valid checkpoint."""
    return load_model_from_checkpoint(out / name, device)


def validation_rows(state: dict[str, Any], tokenizer: Tokenizer) -> np.ndarray:
    """The validation rows of a run, under the run's own corpus, tokenizer and protocol."""
    config = state["train_config"]
    corpus = load_corpus(
        config["dataset"],
        text_field=config["text_field"],
        val_dataset=config["val_dataset"] or None,
    )
    return tokenize_corpus(
        corpus,
        tokenizer,
        protocol=config["protocol"],
        seq_len=config["seq_len"],
        cache_dir=Path(config["cache_dir"]),
    )["validation"].tokens


def reference_texts(out: Path, count: int, length: int) -> list[str]:
    """Held-out text cut to the samples' length in tokens, for MAUVE and the judge."""
    _, tokenizer, state = load(out, "ar")
    rows = validation_rows(state, tokenizer)
    return [tokenizer.decode(row[1 : 1 + length]) for row in rows[:count]]
