"""What every experiment shares: resumable stages cached on disk, training runs that are reused
when finished and resumed when interrupted, and loading a run's checkpoint and validation rows."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from eval.experiments.job_folder import claim_job_folder
from eval.sample_sets import HeldOutText
from eval.stage_key import stage_code, stage_packages, what_changed
from shared import door
from shared.checkpoint import load_model_from_checkpoint
from shared.data.corpus import load_corpus
from shared.data.rows import tokenize_corpus
from shared.door import read_json_file, write_atomic
from shared.errors import ConfigError, result_or_status
from shared.faults import StageInterrupted, StopRequest
from shared.files import cache_folder, use_cache_root
from shared.tokenizer import Tokenizer
from shared.training import new_run, resume_run, train
from shared.training.cli import REQUEUE_STATUS, parse_args
from shared.training.config import TrainConfig
from shared.training.setup import unique_rows

OBJECTIVES = ("ar", "mdm")
UNIQUE_FIELDS = ("unique_tokens", "unique_sample", "seq_len")


class JobStopped(Exception):
    """A signal stopped the job: its running training saved a checkpoint, and a rerun of the
    same command resumes there."""


def stop_requested_between_stages(stop: StopRequest) -> None:
    """Raise ``JobStopped`` when a signal arrived during a stage that does not save (evaluation):
    the stages done so far are stored, so the rerun starts at the next one."""
    if stop.requested:
        raise JobStopped(f"stopped by {stop.signal_name}; rerun the same command to continue")


def check_equal_budgets(summaries: dict[str, dict[str, Any]], budget: str) -> None:
    """A comparison's report states one budget for its runs: check it from the runs' own records
    before writing it (a run stopped early, or reused from another budget, fails here)."""
    unfinished = [
        f"{name} (step {s['step']} of {s['total_steps']})"
        for name, s in summaries.items()
        if not s.get("finished")
    ]
    if unfinished:
        raise ConfigError(
            f"refusing to write a report: these runs did not finish: {', '.join(unfinished)}; "
            "rerun the same command to resume them"
        )
    spent = {
        name: s["tokens_seen"] * (s["flops_per_token"] if budget == "flops" else 1)
        for name, s in summaries.items()
    }
    low, high = min(spent.values()), max(spent.values())
    # A FLOP budget is met to within one step of the run with the most FLOPs per step.
    tolerance = 0.0 if budget == "tokens" else 0.01
    if high - low > tolerance * high:
        listed = ", ".join(f"{name} {value:.6g}" for name, value in spent.items())
        raise ConfigError(
            f"refusing to write a report: the runs' {budget} budgets differ ({listed}); "
            "rerun with --force to retrain them under one budget"
        )


class Stages:
    """Stage results stored as JSON with the key they were computed under: the inputs that
    produced them (settings, and fingerprints of the runs and data they read), the project
    source the stage executed and the versions of the packages that compute it
    (``eval.stage_key``). A stored result is reused only when all three are unchanged, so a
    report never shows a number from code other than the code it names; otherwise it is
    recomputed with one line saying what changed. Stage files are read and written through the
    door with the job's folder (``job``, the claimed ``--out``; default ``root``) as the root,
    and their folder is made without following a link."""

    def __init__(
        self,
        root: Path,
        force: bool,
        stop: StopRequest | None = None,
        job: Path | None = None,
    ):
        self.root, self.force, self.stop = root / "stages", force, stop
        self.job = Path(job if job is not None else root)
        door.make_folders(self.root, self.job)
        self.reused: list[str] = []

    def run(self, name: str, inputs: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """The stored result of stage ``name`` when its inputs, the code it ran and the packages
        are unchanged, else ``compute()`` (stored)."""
        # the inputs as they read back from JSON, so that a stored key compares equal
        key = json.loads(json.dumps(inputs, sort_keys=True, default=str))
        path = self.root / f"{name}.json"
        if os.path.lexists(path) and not self.force:
            stored = read_stage(path, self.job)
            changed = what_changed(stored, key)
            if not changed:
                print(f"[{name}] reusing the stored result (--force recomputes)")
                self.reused.append(name)
                return stored["result"]
            print(f"[{name}] recomputing: {'; '.join(changed)}")
        if self.stop is not None:
            stop_requested_between_stages(self.stop)
        before = stage_code()
        start = time.perf_counter()
        try:
            with self.stop.interrupting(name) if self.stop else contextlib.nullcontext():
                result = compute()
        except StageInterrupted as signal_name:
            raise JobStopped(
                f"stopped by {signal_name} during the {name} stage (the stages before it are "
                "stored); rerun the same command to continue"
            ) from None
        elapsed = time.perf_counter() - start
        record = {
            "inputs": key,
            "code": stage_code(before),
            "packages": stage_packages(),
            "seconds": elapsed,
            "result": result,
        }
        # whole or not at all: a stage cut short by a full disk is recomputed, never half-read
        write_atomic(path, json.dumps(record, indent=2, default=float), root=self.job)
        print(f"[{name}] done in {elapsed:.1f} s")
        return result


def read_stage(path: Path, job: Path) -> dict[str, Any]:
    """A stored stage, read through the door inside the job's folder ``job``, or an empty record
    when it cannot be read as one (a damaged or foreign file is recomputed, not trusted)."""
    try:
        stored = door.read_json_file(path, root=job, allow_nan=True)
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def run_stoppable(job: Callable[[StopRequest], None]) -> int:
    """Run an experiment's command-line job: 0 when it ends; ``REQUEUE_STATUS`` (75, as a
    stopped training run) when SIGTERM/SIGINT stopped it after saving what it had (the running
    training saved a checkpoint, finished stages are stored, a stage cut short left nothing), so
    a rerun continues; 2 with one line on a user error."""
    stop = StopRequest(
        on_stop="stopping at the end of the current stage (finished stages are kept)"
    )

    def guarded() -> bool:
        try:
            job(stop)
        except JobStopped as stopped:
            print(stopped, flush=True)
            return True
        return False

    try:
        stopped, status = result_or_status(guarded)
        return REQUEUE_STATUS if status == 0 and stopped else status
    finally:
        stop.close()


def locked_job(
    out: Path, force: bool, job: Callable[[StopRequest], None], kind: str = "compare job"
):
    """``job`` run under ``claim_job_folder`` as a ``kind`` job; a stop says to rerun without
    ``--force``, which would set the job aside again."""

    def run(stop: StopRequest) -> None:
        lock = claim_job_folder(out, force, kind)
        try:
            job(stop)
        except JobStopped as stopped:
            if not force:
                raise
            raise JobStopped(f"{stopped} (without --force, which starts the job over)") from None
        finally:
            lock.release()

    return run


def training_overrides(flags: list[str]) -> dict[str, Any]:
    """The training settings among an experiment's command-line flags (``--max-steps 800`` ->
    ``{"max_steps": 800}``), parsed and checked as ``train.py`` parses them. A typed
    ``--cache-dir`` becomes the job's cache root (``shared.files.use_cache_root``), so the
    stages' own row loading goes there too."""
    overrides = parse_args(flags)[1]
    use_cache_root(overrides.get("cache_dir"))
    return overrides


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
        summary = read_json_file(final, allow_nan=True)
        if summary.get("finished") and same_settings(run_dir, overrides):
            print(f"[train {label}] reusing the finished run in {run_dir}")
            summary["reused"] = True
            return summary
    if (
        not force
        and (run_dir / "checkpoints").is_dir()
        and any((run_dir / "checkpoints").iterdir())
    ):
        try:
            summary = train(resume_run(run_dir, preset=preset, **overrides))
        except ConfigError as refused:
            raise ConfigError(continue_refused(run_dir, refused)) from None
    else:
        # A folder without a checkpoint holds nothing to resume (a run stopped before its
        # first save), and a forced one is retrained: start over it (the old files are moved
        # aside).
        summary = train(new_run(preset, run_dir, overwrite=True, **start, **overrides))
    if summary["stopped_by"]:
        raise JobStopped(
            f"stopped by {summary['stopped_by']} while training {label} (step "
            f"{summary['step']} of {summary['total_steps']}, checkpoint saved); rerun the same "
            "command to resume"
        )
    return summary


def continue_refused(run_dir: Path, refused: ConfigError) -> str:
    """What to do when the run an experiment would continue refuses these settings (another
    seed or shape, a smaller budget): the experiment has neither --allow-config-change nor
    --resume, so name the ways it has."""
    why = str(refused)
    for hint in (
        " (pass --allow-config-change to accept)",
        " (raise the budget, e.g. --max-steps, to continue it)",
    ):
        why = why.replace(hint, "")
    return (
        f"the run in {run_dir} cannot continue under this command's settings: {why}\n"
        "use another --out for these settings, or --force to set the earlier job aside (moved, "
        "not deleted) and start over"
    )


def training_seed(run_dir: Path) -> int:
    """The seed the run in ``run_dir`` was trained with (its saved training config)."""
    return read_json_file(run_dir / "config.json")["train_config"]["seed"]


def same_settings(run_dir: Path, overrides: dict[str, Any]) -> bool:
    """Whether the run in ``run_dir`` was trained with ``overrides`` (a budget, a shape...)."""
    saved = read_json_file(run_dir / "config.json")
    config = saved["model_config"] | saved["train_config"]
    return all(config.get(name) == value for name, value in overrides.items())


def train_both(
    preset: str,
    out: Path,
    overrides: dict[str, Any],
    budget: str,
    force: bool,
    own: dict[str, dict[str, Any]] | None = None,
    objectives: tuple[str, ...] = OBJECTIVES,
) -> dict[str, dict[str, Any]]:
    """The AR and the MDM run of a comparison (or every run of ``objectives``, AR first), under
    one token budget or, with ``budget == "flops"``, each diffusion run under the FLOPs the AR
    run spent; ``own`` holds settings of one objective only (its tuned learning rate)."""
    summaries = {}
    flops_budget: dict[str, Any] = {}
    for objective in objectives:
        summaries[objective] = train_or_reuse(
            objective,
            out / objective,
            preset,
            {"objective": objective},
            overrides | (own or {}).get(objective, {}) | flops_budget,
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
    return split_rows(state, tokenizer, "validation")


def training_rows(state: dict[str, Any], tokenizer: Tokenizer) -> np.ndarray:
    """The rows a run trained on (after ``unique_tokens``), under its own tokenizer."""
    rows = split_rows(state, tokenizer, "train")
    config = state["train_config"]
    return unique_rows(rows, TrainConfig(**{k: config[k] for k in UNIQUE_FIELDS if k in config}))


def split_rows(state: dict[str, Any], tokenizer: Tokenizer, split: str) -> np.ndarray:
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
        cache_dir=cache_folder(None),  # the user's cache, never one the run's record names
    )[split].tokens


def held_out(out: Path, count: int, length: int) -> tuple[list[list[int]], list[str], HeldOutText]:
    """What samples are compared with, from one load of the AR run's tokenizer and held-out
    rows: the token ids and texts of the first ``count`` held-out documents from their start,
    each cut at its EOS and at ``length`` tokens, as every sample is (``eval.sample_sets``: a
    sample starts after a document boundary and ends at its first EOS), and the held-out split
    as one stream for the frontier's marks (``HeldOutText``)."""
    _, tokenizer, state = load(out, "ar")
    rows = validation_rows(state, tokenizer)
    ids = held_out_documents(rows, tokenizer.eos_id, tokenizer.pad_id, count, length)
    boundaries = (tokenizer.eos_id, tokenizer.pad_id)
    stream = [int(t) for row in rows for t in row[1:] if t not in boundaries]
    texts = [tokenizer.decode(row) for row in ids]
    return ids, texts, HeldOutText(stream, tokenizer.decode)


def held_out_documents(
    rows: np.ndarray, eos_id: int, pad_id: int | None, count: int, length: int
) -> list[list[int]]:
    """The first ``count`` non-empty documents of ``rows`` (each row's tokens after BOS, joined;
    EOS and padding end a document), every one cut to its first ``length`` tokens."""
    documents, current = [], []
    for token in (int(t) for row in rows for t in row[1:]):
        if token not in (eos_id, pad_id):
            current.append(token)
            continue
        if current:
            documents.append(current[:length])
            if len(documents) == count:
                return documents
        current = []
    if current and len(documents) < count:
        documents.append(current[:length])
    return documents
