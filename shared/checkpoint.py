"""Checkpoints: written atomically, verified on load, self-describing.

A checkpoint is a directory ``step_000123/`` holding

- ``model.safetensors``       the weights (tied weights stored once),
- ``optimizer.safetensors``   the optimizer's tensors (moments, step counts) by parameter name,
- ``optimizer.json``          its parameter groups and the LR-scheduler state,
- ``rng.json``                torch / numpy / python RNG states,
- ``state.json``              step, model and training config, objective, data protocol,
- ``tokenizer/``              the tokenizer, so the checkpoint decodes on its own,
- ``manifest.json``           sha256 of every file above, written last.

Nothing in it can carry code: tensors are safetensors, the rest is JSON
(``shared.training_state``). Checkpoints of earlier releases hold the training state as Python
pickles (``optimizer.pt``, ``rng.pt``); a resume refuses them and says how to convert them
(``duolm convert-checkpoint``), and their weights still load for sampling and evaluation.

It is built in a temporary sibling directory, every file is fsynced, and one ``rename`` makes it
visible: a crash leaves either the previous checkpoints or the complete new one, never half of it.

Weights and optimizer state are stored whole and keyed by parameter name whatever the training
layout (one process, DDP, FSDP), so a checkpoint written by one layout resumes under any other:
``full_model_state`` / ``full_optimizer_state`` gather them from a sharded model, and
``load_optimizer_state`` scatters them back.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model
from torch import nn

from shared import door
from shared.config import ModelConfig
from shared.door import fsync_dir, fsync_tree, read_json_file
from shared.errors import CheckpointError
from shared.faults import kill_now_if
from shared.model import Transformer
from shared.objective import added_vocab_rows
from shared.path_checks import refuse_link, refuse_links_within
from shared.tensor_files import StoredTensor, read_tensor_header, save_tensors
from shared.tokenizer import Tokenizer
from shared.training_state import (
    rng_state,
    write_training_state,
)
from shared.weights_fit import check_layer_count, check_weights_fit

CHECKPOINT_PATTERN = re.compile(r"^step_(\d{6,})$")
MANIFEST = "manifest.json"
SHARDS = "shards"  # a sharded checkpoint's folder of DCP files (shared.sharded_checkpoint)
WEIGHTS = "model.safetensors"
BEST_FILE = "best.json"  # {"step", "val_nats_per_token"} of the best checkpoint so far


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with door.open_read(path, error=CheckpointError) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Gathered in full on rank 0 and moved to CPU there; the other ranks get empty dicts.


# Name segments that DDP, FSDP1, activation checkpointing and torch.compile insert.
_WRAPPER_SEGMENTS = {"module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}


def bare_name(name: str) -> str:
    """A parameter's name in the bare module, without wrapper segments."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def tied_copies(model: nn.Module) -> set[str]:
    """Bare names of parameters that are another name's tensor (tied weights), not saved.

    Of each tied group the alphabetically first name is kept, as ``safetensors`` does.
    """
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(bare_name(name))
    return {name for names in groups.values() for name in sorted(names)[1:]}


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded over processes (FSDP2 makes them DTensors)."""
    # torch.distributed.tensor and torch.distributed.checkpoint take about half a second to
    # import; a process that never imported them (sampling, evaluation, one-process training)
    # holds no DTensor, so it never pays for them
    tensor_module = sys.modules.get("torch.distributed.tensor")
    if tensor_module is None:
        return False
    return any(isinstance(param, tensor_module.DTensor) for param in model.parameters())


def _distributed_state_dict():
    """torch.distributed.checkpoint's state-dict helpers, imported when a sharded model needs
    them (see ``is_sharded``)."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _gather_full():
    options = _distributed_state_dict().StateDictOptions
    return options(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of ``model`` (bare, DDP- or FSDP-wrapped) whole, on CPU, keyed by the bare
    module's parameter names, tied copies left out.

    Under FSDP this is a collective: every rank must call it; only rank 0 gets the weights.
    """
    if is_sharded(model):
        weights = _distributed_state_dict().get_model_state_dict(model, options=_gather_full())
    else:
        weights = {bare_name(name): t for name, t in model.state_dict().items()}
    drop = tied_copies(model)
    # contiguous, unaliased copies: safetensors refuses views and shared storage
    return {name: t.detach().contiguous() for name, t in weights.items() if name not in drop}


def _optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The bare name of each parameter the optimizer steps, in the optimizer's index order (a
    tied parameter goes by its first name, as torch.distributed.checkpoint names it)."""
    names = {id(param): bare_name(name) for name, param in model.named_parameters()}
    return [names[id(param)] for group in optimizer.param_groups for param in group["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state whole, keyed by parameter name (collective under FSDP, as above)."""
    if is_sharded(model):
        helpers = _distributed_state_dict()
        return helpers.get_optimizer_state_dict(model, optimizer, options=_gather_full())
    # Unsharded: rename the indices directly. (torch.distributed.checkpoint's helper gives the
    # same dict, but first fills an empty optimizer state by taking a zero-learning-rate step.)
    names = _optimizer_names(model, optimizer)
    by_index = optimizer.state_dict()
    return {
        "state": {names[index]: value for index, value in by_index["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in by_index["param_groups"]
        ],
    }


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """Load a whole, name-keyed optimizer state into ``optimizer``, sharding it as ``model`` is.

    Every rank passes the same whole state, before any gradient exists (as when resuming).
    States keyed by parameter index (checkpoints written before states were name-keyed) load
    directly, which is only valid for unsharded models.
    """
    if any(isinstance(key, int) for key in saved["state"]):
        optimizer.load_state_dict(saved)
    elif is_sharded(model):
        helpers = _distributed_state_dict()
        helpers.set_optimizer_state_dict(
            model, optimizer, saved, options=helpers.StateDictOptions(full_state_dict=True)
        )
    else:
        index = {name: i for i, name in enumerate(_optimizer_names(model, optimizer))}
        optimizer.load_state_dict(
            {
                "state": {index[name]: value for name, value in saved["state"].items()},
                "param_groups": [
                    {**group, "params": [index[name] for name in group["params"]]}
                    for group in saved["param_groups"]
                ],
            }
        )


def save_checkpoint(
    root: Path,
    step: int,
    *,
    weights: dict[str, torch.Tensor] | Callable[[Path], None],
    tokenizer: Tokenizer,
    state: dict[str, Any],
    optimizer_state: dict[str, Any] | None = None,
    scheduler_state: dict[str, Any] | None = None,
    keep_last: int = 0,
    protect: tuple[Path, ...] = (),
) -> Path:
    """Write ``root/step_{step}`` atomically and return its path.

    ``weights`` comes from ``full_model_state``, or is a function that writes the
    model.safetensors file at the path it is given (an import streams tensors one at a time);
    ``optimizer_state`` comes from ``full_optimizer_state``. ``keep_last > 0`` then deletes all
    but the newest ``keep_last`` checkpoints, except those in ``protect`` (the best checkpoint so
    far).
    """
    door.make_folders(root)
    # Staging directories left by a process that died mid-save are garbage: only one process
    # writes checkpoints, so anything staged before this call is dead.
    for stale in root.glob(".step_*"):
        door.remove_tree(stale)
    final = root / checkpoint_name(step)
    staging = door.make_temp_folder(root, f".{final.name}.")
    retired = staging.with_name(f"{staging.name}.retired")
    try:
        if callable(weights):
            weights(staging / "model.safetensors")
        else:
            save_tensors(weights, staging / "model.safetensors")
        kill_now_if("kill_in_checkpoint", step)  # tests: a crash in the middle of a save
        write_training_state(
            staging,
            optimizer_state=optimizer_state,
            scheduler_state=scheduler_state,
            rng=rng_state(),
        )
        door.write_atomic(staging / "state.json", json.dumps({"step": step, **state}, indent=2))
        tokenizer.save(staging / "tokenizer")
        seal(staging)
        # Re-saving the same step (e.g. after a resume) replaces it whole: the old one is renamed
        # out of the way (a staging name, so a crash before the next line leaves it as garbage
        # the next save clears) rather than deleted file by file before the new one is in place.
        if final.exists():
            door.rename(final, retired)
        door.rename(staging, final)
        fsync_dir(root)
    except BaseException:
        door.remove_tree(staging)
        if retired.exists() and not final.exists():  # the step's old checkpoint stays
            door.rename(retired, final)
        raise
    door.remove_tree(retired)
    if keep_last > 0:
        remove_old_checkpoints(root, keep_last, protect)
    return final


def seal(staging: Path) -> None:
    """List every file of a staged checkpoint with its checksum, give the files the umask's
    modes and flush them to disk: what is renamed into place next is complete."""
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(staging)): file_sha256(p) for p in files}
    door.write_atomic(staging / MANIFEST, json.dumps(manifest, indent=2))
    door.follow_umask(staging)
    fsync_tree(staging)


def remove_old_checkpoints(root: Path, keep_last: int, protect: tuple[Path, ...]) -> None:
    """Delete all but the newest ``keep_last`` checkpoints under ``root``, except ``protect``."""
    kept = {Path(p).resolve() for p in protect}
    for old in list_checkpoints(root)[:-keep_last]:
        if old.resolve() not in kept:
            door.remove_tree(old)


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under ``root``, oldest first (staging dirs are ignored)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)))


def refuse_checkpoint_links(path: Path) -> None:
    """Refuse a checkpoint that is, holds, or sits in a ``checkpoints/`` folder that is a
    symbolic link, before any of its files is opened: a run folder is something people pass
    around, and a link in it (``rng.json`` to a file of this machine, ``step_000100`` to a
    folder elsewhere) would make a resume read what the folder's author chose. Its files are
    regular files, or folders of them."""
    path = Path(path)
    if path.parent.name == "checkpoints":
        refuse_link(path.parent, "a run")
    refuse_links_within(path, "a checkpoint")


def read_manifest(path: Path) -> dict[str, str]:
    """{file name: sha256} of a checkpoint."""
    refuse_checkpoint_links(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST} (incomplete checkpoint)")
    manifest = read_json_file(manifest_path, CheckpointError)
    if not isinstance(manifest, dict) or not all(isinstance(v, str) for v in manifest.values()):
        raise CheckpointError(f"{path}: {MANIFEST} is not a mapping of files to checksums")
    outside = [name for name in manifest if Path(name).is_absolute() or ".." in Path(name).parts]
    if outside:  # a checkpoint describes its own files, never others on this machine
        raise CheckpointError(f"{path}: {MANIFEST} lists files outside the checkpoint: {outside}")
    return manifest


def verify_checkpoint(path: Path) -> None:
    """Raise ``CheckpointError`` unless every file listed in the manifest is present and intact."""
    for name, expected in read_manifest(path).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: missing file {name}")
        if file_sha256(file) != expected:
            raise CheckpointError(f"{path}: checksum mismatch in {name} (corrupted or truncated)")


def resolve_checkpoint(path: Path, log=print) -> Path:
    """A checkpoint directory, or the newest valid one under a run or checkpoints directory.

    Invalid checkpoints are skipped with a message saying which and why.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    door.declare_root(path)  # the folder the user named: every path below it is walked from it
    if (path / MANIFEST).exists() or CHECKPOINT_PATTERN.match(path.name):
        verify_checkpoint(path)
        return path
    refuse_link(path / "checkpoints", "a run")
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    candidates = list_checkpoints(root)
    if not candidates:
        raise CheckpointError(f"no checkpoints found under {root}")
    for candidate in reversed(candidates):
        try:
            verify_checkpoint(candidate)
            return candidate
        except CheckpointError as error:
            log(f"skipping checkpoint {candidate.name}: {error}")
    raise CheckpointError(f"no valid checkpoint under {root}: all {len(candidates)} failed checks")


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state.json (its step, configs, objective), which must be a JSON object."""
    refuse_checkpoint_links(path)
    file = Path(path) / "state.json"
    state = read_json_file(file, CheckpointError, allow_nan=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: holds a JSON {type(state).__name__}, not an object")
    return state


def is_sharded_checkpoint(path: Path) -> bool:
    return (Path(path) / SHARDS).is_dir() and not (Path(path) / WEIGHTS).exists()


def refuse_unlisted_weights(path: Path) -> None:
    """The weights a reader loads must be listed (and so checksummed) in the manifest: a
    ``model.safetensors`` the manifest does not name (added later, or beside a sharded
    checkpoint's shards) is refused, never read unverified."""
    if WEIGHTS not in read_manifest(path):
        raise CheckpointError(
            f"{path}: its {MANIFEST} does not list {WEIGHTS}, so those weights are unverified; "
            "a checkpoint's weights are read only when its manifest lists them"
        )


def refuse_sharded(path: Path) -> None:
    """The single-file reader (sampling, evaluation, export, --init-from) refuses a sharded
    checkpoint with the command that converts it."""
    if is_sharded_checkpoint(path):
        raise CheckpointError(
            f"{path}: a sharded checkpoint (torch.distributed.checkpoint shards, no "
            "model.safetensors); this reads single-file checkpoints: convert it first with "
            f"duolm convert-checkpoint {path} --to single"
        )


def load_weights(path: Path, model: nn.Module) -> None:
    """The checkpoint's weights into ``model``, once its header shows they fit it."""
    header = weights_header(path)
    check_weights_fit(path, model, header)
    with door.opened_path(Path(path) / WEIGHTS, path, error=CheckpointError) as file:
        load_checked_weights(path, model, file)


def weights_header(path: Path) -> dict[str, StoredTensor]:
    """What the checkpoint's ``model.safetensors`` declares (its header alone, read through the
    door and checked against the file's size), after the refusals every weights reader makes."""
    refuse_checkpoint_links(path)
    refuse_sharded(path)
    refuse_unlisted_weights(path)
    return read_tensor_header(Path(path) / WEIGHTS, path, error=CheckpointError)


def load_checked_weights(path: Path, model: nn.Module, file: str) -> None:
    """The tensors of ``file`` (the door's name for the checkpoint's weights) into ``model``."""
    missing, unexpected = load_model(model, file, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit the model (missing {missing}, unexpected {unexpected})"
        )


def meta_model_fitting(
    path: Path, config: ModelConfig, header: dict[str, StoredTensor] | None = None
) -> Transformer:
    """The model ``config`` describes, on the meta device (shapes, no memory), once the
    checkpoint's weights header (``header``: what a sharded checkpoint's index declares) shows
    that its weights fit it."""
    header = weights_header(path) if header is None else header
    check_layer_count(path, config, header)  # before even the meta model is built layer by layer
    with torch.device("meta"):
        model = Transformer(config)
    check_weights_fit(path, model, header)
    return model


def model_from_weights(path: Path, config: ModelConfig) -> Transformer:
    """The model ``config`` describes with the checkpoint's weights in it. It is built on the
    meta device (shapes, no memory) and compared with the weights' header first, so a config
    that asks for more than the weights hold (a few-KB checkpoint naming 13B parameters) is
    refused before anything of its size is allocated."""
    model = meta_model_fitting(path, config)
    model.materialise("cpu")
    with door.opened_path(Path(path) / WEIGHTS, path, error=CheckpointError) as file:
        load_checked_weights(path, model, file)
    return model


def load_model_from_checkpoint(path: Path, device: str | torch.device = "cpu"):
    """(model, tokenizer, state) from a checkpoint, for sampling and evaluation."""

    path = resolve_checkpoint(Path(path))
    state = read_state(path)
    model = model_from_weights(path, ModelConfig.from_dict(state["model_config"]))
    tokenizer = Tokenizer.load(path / "tokenizer")
    # The absorbing-state diffusion models (mdm, bd) have one extra row ([MASK]), as their
    # objective says; anything else is a mismatch.
    extra = added_vocab_rows(state.get("objective"))
    if model.config.vocab_size != tokenizer.vocab_size + extra:
        raise CheckpointError(
            f"{path}: the model's vocabulary ({model.config.vocab_size} rows) does not fit its "
            f"tokenizer ({tokenizer.vocab_size} ids{' + [MASK]' if extra else ''})"
        )
    return model.to(device).eval(), tokenizer, state


def read_best(root: Path) -> dict[str, Any] | None:
    """The record of a run's best checkpoint so far (``BEST_FILE``), None when there is none to
    read; a record without a whole-number "step" >= 0 or a number "val_nats_per_token" is one
    line naming the file and the field (the run picks which checkpoint to keep by them)."""
    path = Path(root) / BEST_FILE
    try:
        best = door.read_json_object(path, root=root, limit=1 << 16, allow_nan=True)
    except (OSError, ValueError):  # missing, not a regular file, a link, or not a JSON object
        return None
    step, loss = best.get("step"), best.get("val_nats_per_token")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        field, wanted = "step", "a whole number >= 0"
    elif isinstance(loss, bool) or not isinstance(loss, (int, float)):
        field, wanted = "val_nats_per_token", "a number"
    else:
        return best
    found = "missing" if field not in best else f"{best[field]!r}"
    raise CheckpointError(
        f'{path}: "{field}" is {found}; it must be {wanted} (the record of the best checkpoint '
        "so far: restore it, or remove the file to let the run choose again)"
    )
