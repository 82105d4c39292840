"""What a training run is, as a typed value: ``RunSpec``, and the two ways to make one (a new run
from a preset, or the continuation of a checkpoint). ``shared.training.train(spec)`` runs it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.checkpoint import read_state, resolve_checkpoint
from shared.config import ModelConfig
from shared.errors import CheckpointError, ConfigError
from shared.resume_state import check_training_state
from shared.training.config import TrainConfig
from shared.training.presets import resolve_config
from shared.training.resume import resumed_config
from shared.training.run_folder import holder_if_locked, holds_run, why_not_movable


@dataclass(frozen=True)
class RunSpec:
    """Everything ``train`` needs: the backbone shape, the training settings, the run folder and,
    when continuing, the checkpoint folder (``.../checkpoints/step_NNNNNN``) to continue from."""

    model: ModelConfig
    train: TrainConfig
    out: Path
    preset: str = ""
    resume_from: Path | None = None
    allow_config_change: bool = False  # resume even when the corpus changed
    overwrite: bool = False  # start even where a run exists, moving the old run aside

    @property
    def is_branch(self) -> bool:
        """Whether the run starts from another run's checkpoint in a folder of its own (a WSD
        cooldown branch), rather than resuming its own folder or starting fresh."""
        if self.resume_from is None:
            return False
        return self.resume_from.parent.parent.resolve() != self.out.resolve()


def new_run(
    preset: str, out: str | Path | None = None, *, overwrite: bool = False, **overrides: Any
) -> RunSpec:
    """A run of ``preset`` with ``overrides`` (any ModelConfig or TrainConfig field) applied;
    ``out`` defaults to ``runs/<preset>-<objective>``. A folder that already holds a run
    refuses it unless ``overwrite`` (which moves the old run aside). A run with ``init_from``
    takes the source's backbone shape and tokenizer for every field not given in
    ``overrides`` (``inherited_from_source``)."""
    init_from = overrides.get("init_from") or ""
    inherited = inherited_from_source(init_from)
    try:
        model_cfg, train_cfg = resolve_config(preset, inherited | overrides)
    except ConfigError:
        # A flag against the source can make the mixed shape invalid (the source's 9 heads with
        # a typed dim of 128): the conflict is the error to name, as check_start names it.
        refuse_source_conflicts(init_from, inherited, overrides)
        raise
    folder = Path(out) if out else Path("runs") / f"{preset}-{train_cfg.objective}"
    return RunSpec(model_cfg, train_cfg, folder, preset, overwrite=overwrite)


# the backbone fields an --init-from source decides (the vocabulary follows the tokenizer and the
# objective; shift_logits is the new run's choice, and so is time_conditioning unless the source
# has it: its time embedding cannot be dropped)
NOT_INHERITED = ("vocab_size", "shift_logits", "time_conditioning")


def inherited_from_source(init_from: str) -> dict[str, Any]:
    """The settings a run started from ``init_from`` takes from its source: every backbone field
    but ``NOT_INHERITED``, and the tokenizer setting. An unreadable source gives nothing here;
    ``warm_start.check_start`` reports it with the run's other checks."""
    if not init_from:
        return {}
    try:
        state = read_state(resolve_checkpoint(Path(init_from), log=lambda _: None))
    except (CheckpointError, OSError, ValueError):
        return {}
    shape = dataclasses.asdict(ModelConfig.from_dict(state["model_config"]))
    inherited = {k: v for k, v in shape.items() if k not in NOT_INHERITED}
    if shape["time_conditioning"]:
        inherited["time_conditioning"] = True
    for name in ("tokenizer", "tokenizer_vocab_size"):
        if name in state.get("train_config", {}):
            inherited[name] = state["train_config"][name]
    return inherited


def refuse_source_conflicts(
    init_from: str, inherited: dict[str, Any], overrides: dict[str, Any]
) -> None:
    """Refuse a flag that gives a field the source decides another value, naming each one (in
    ``check_start``'s words)."""
    checked = {
        name: value
        for name, value in inherited.items()
        if name != "tokenizer_vocab_size" or inherited.get("tokenizer") == "bpe"
    }
    wrong = [
        f"{name}={theirs!r} in the source, {overrides[name]!r} in this run"
        for name, theirs in checked.items()
        if name in overrides and overrides[name] != theirs
    ]
    if wrong:
        raise ConfigError(f"--init-from {init_from}: " + "; ".join(wrong))


def resume_run(
    path: str | Path,
    out: str | Path | None = None,
    *,
    preset: str = "",
    allow_config_change: bool = False,
    verified: bool = False,
    **overrides: Any,
) -> RunSpec:
    """The continuation of the newest valid checkpoint under ``path`` (a run or checkpoint
    folder), with ``overrides`` applied to its saved config (see ``resumed_config``). With an
    ``out`` other than the checkpoint's own run folder it is a branch: a new run that starts
    from that checkpoint (a WSD cooldown branch, see docs/training.md). ``verified``: ``path``
    is the checkpoint itself, which ``resumable_checkpoint`` has passed already (on the main
    process, for every process of a launch)."""
    checkpoint = Path(path) if verified else resumable_checkpoint(Path(path))
    saved = read_state(checkpoint)
    preset = resumed_preset(saved.get("preset"), preset, checkpoint)
    folder = Path(out) if out else checkpoint.parent.parent
    if folder.resolve() != checkpoint.parent.parent.resolve():
        # A branch (a shorter WSD budget off a longer run) does not inherit the points its
        # source kept for its own branches.
        overrides = {"branch_budgets": ""} | overrides
    model_cfg, train_cfg = resumed_config(saved, overrides, allow_config_change)
    return RunSpec(model_cfg, train_cfg, folder, preset, checkpoint, allow_config_change)


def resumed_preset(saved: Any, typed: str, checkpoint: Path) -> str:
    """The preset a continued run records: the one it was made from (its shape and settings
    come from the checkpoint, not from a preset). A different ``--preset`` typed beside
    ``--resume`` is refused rather than recorded over the run's own."""
    saved = saved if isinstance(saved, str) else ""
    if typed and saved and typed != saved:
        raise ConfigError(
            f"--preset {typed}: the run of {checkpoint} was made from the preset {saved!r}, and "
            "a resume keeps its shape and settings (drop --preset, or start a new run)"
        )
    return saved or typed


def resumable_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``--resume path`` continues from. A run folder in use by a live run is
    reported as such (its checkpoints may still be being written); one with no checkpoint says
    how to start over it, and one of an earlier release how to convert it."""
    path = Path(path)
    holder = holder_if_locked(path)
    if holder:
        raise ConfigError(
            f"the run folder {path} is in use by another run ({holder}); wait for it to end"
        )
    try:
        checkpoint = resolve_checkpoint(path)
    except CheckpointError as error:
        if path.is_dir() and not (path / "state.json").exists():
            raise CheckpointError(f"{error}: {nothing_to_resume(path)}") from None
        raise
    check_training_state(checkpoint)  # before anything else: it may need converting first
    return checkpoint


def nothing_to_resume(path: Path) -> str:
    """Why a folder with no checkpoint cannot be resumed, and what to do instead. Starting over
    it with ``--overwrite`` is suggested only where that would be allowed to move the old run
    aside (``why_not_movable``, the rule ``claim_run_folder`` applies), and never for a folder
    that holds no run at all."""
    if not holds_run(path):
        return (
            f"nothing to resume: {path} holds no training run; give a run folder or one of its "
            "checkpoints"
        )
    stopped = "nothing to resume (the run stopped before its first checkpoint)"
    why_not = why_not_movable(path)
    if why_not:
        return f"{stopped}; start a new run in another folder ({path} {why_not})"
    return f"{stopped}; start a new run there with --out {path} --overwrite"
