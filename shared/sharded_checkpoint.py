"""Sharded checkpoints: every process writes its own part of the weights and optimizer state
with ``torch.distributed.checkpoint`` (DCP); nothing is gathered on one process.

A sharded checkpoint is a folder ``step_000123/`` like a single-file one (``shared.checkpoint``),
with ``shards/`` in place of ``model.safetensors`` and ``optimizer.safetensors``:

- ``shards/__<rank>_0.distcp``  the tensors each process held: weights under ``model/<name>``,
  AdamW's moments and step counts under ``optimizer/<name>/<entry>``;
- ``shards/index.json``         the index of them (which slice of which tensor is where), as
  strict JSON of names and numbers (``shared.sharded_index``);
- ``shards/.metadata``          DCP's own pickle of the same index, kept for DCP's tools and
  never read by this project except by ``convert-checkpoint --trust``;
- ``optimizer.json``, ``rng.json``, ``state.json``, ``tokenizer/``, ``manifest.json`` as in a
  single-file checkpoint (``state.json`` says ``"checkpoint_format": "sharded"``).

It resumes on any number of processes, sharded or not: DCP reads each process's slices from
whichever files hold them. ``duolm convert-checkpoint PATH --to single`` turns it into a
single-file checkpoint (the format of export, import, evaluation and sampling), one tensor at a
time (``to_single_file``).

Written as a single-file checkpoint is: staged in ``.step_000123.sharded`` beside the others,
every file fsynced (DCP's writer fsyncs its shards), the manifest (sha256 of every file, each
process hashing the shards it wrote) last, then one ``rename``. The processes must share the
file system the run folder is on, as DCP itself requires.

Checkpoints never run code, and nothing received is unpickled: the index is read from
``shards/index.json``, every field checked (``shared.sharded_index.checked_index``), and DCP is
handed a ``Metadata`` built in code from the checked values in place of its pickle. Each
tensor's record in a ``.distcp`` file (the zip ``torch.save`` writes) is read by
``shared.sharded_blobs`` as raw bytes of the dtype and shape the index gives, where DCP's own
reader would ``torch.load`` it.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import struct
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shared import checkpoint as ckpt
from shared import door
from shared.door import fsync_dir, fsync_tree
from shared.errors import CheckpointError
from shared.faults import kill_now_if
from shared.resume_state import check_training_state
from shared.sharded_blobs import chunk_shapes, read_items
from shared.sharded_index import (
    _SAFETENSORS_DTYPES,
    INDEX,
    METADATA,
    index_record,
    index_text,
    read_index,
)
from shared.training_state import (
    FORMAT,
    OPTIMIZER_RECORD,
    OPTIMIZER_TENSORS,
    RNG_RECORD,
    read_optimizer_record,
    read_rng_state,
    restore_rng_state,
    rng_record,
    rng_state,
)

SHARDS = ckpt.SHARDS
# auto: sharded under FSDP from this many parameters (below it, gathering on rank 0 is cheap)
AUTO_SHARDED_PARAMETERS = 1_000_000_000


def checkpoint_format(setting: str, layout: str, parameters: int) -> str:
    """The format a run writes: ``setting`` unless auto, which is sharded under FSDP from
    ``AUTO_SHARDED_PARAMETERS`` parameters and single otherwise."""
    if setting != "auto":
        return setting
    return (
        "sharded"
        if layout.startswith("FSDP") and parameters >= AUTO_SHARDED_PARAMETERS
        else ("single")
    )


def _dcp():
    import torch.distributed.checkpoint as dcp

    return dcp


@contextlib.contextmanager
def _quiet():
    """DCP warns that it assumes one process when none is initialised; here that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _helpers():
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()


# ------------------------------------------------------------------------ the index


def _door_file_system():
    """DCP's file system with every open, folder, rename and removal made through the door, so
    DCP reads and writes a checkpoint's shards as the rest of duolm does (no link followed below
    the run folder, only regular files, new files never over old ones)."""

    class DoorFileSystem(_dcp().filesystem.FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode: str):
            if mode in ("rb", "r"):
                with door.open_read(Path(path), error=CheckpointError) as stream:
                    yield stream
            elif mode == "wb":
                with door.open_new_file(Path(path)) as stream:
                    yield stream
            else:
                raise CheckpointError(f"{path}: DCP asked to open it as {mode!r}")

        def rename(self, path, new_path) -> None:
            door.rename(Path(path), Path(new_path))

        def mkdir(self, path) -> None:
            door.make_folders(Path(path))

        def rm_file(self, path) -> None:
            door.remove_file(Path(path))

    return DoorFileSystem()


def _index_writer(folder: Path):
    """DCP's file writer, which also writes the index as ``shards/index.json`` (the file this
    project reads), and pickles DCP's own copy at protocol 2 with no path in it (the form
    ``convert-checkpoint --trust`` reads in checkpoints of earlier versions)."""
    from torch.distributed.checkpoint import metadata as index_classes

    class IndexWriter(_dcp().FileSystemWriter):
        def finish(self, metadata, results) -> None:  # DCP passes both by keyword
            super().finish(metadata=metadata, results=results)
            metadata.storage_meta = index_classes.StorageMeta()
            door.write_atomic(
                Path(self.path) / ".metadata", pickle.dumps(metadata, protocol=2), durable=True
            )
            try:  # refused here rather than written as a checkpoint no reader accepts
                record = index_record(metadata)
            except ValueError as error:
                raise CheckpointError(f"{self.path}: its index has no JSON form: {error}") from None
            door.write_atomic(Path(self.path) / Path(INDEX).name, index_text(record), durable=True)

    writer = IndexWriter(str(folder), thread_count=1, sync_files=True)
    writer.fs = _door_file_system()
    return writer


def _checked_reader(path: Path, index: Any):
    """DCP's file reader, given the index ``read_index`` built from ``shards/index.json`` in
    place of the pickled one it would read, and reading each tensor's record as a zip of raw
    bytes (``shared.sharded_blobs``) where DCP's own would ``torch.load`` it."""
    base = _dcp().FileSystemReader
    shapes = chunk_shapes(index)

    class CheckedReader(base):
        def read_metadata(self, *args, **kwargs):
            index.storage_meta = index.storage_meta or _dcp().metadata.StorageMeta()
            index.storage_meta.load_id = self.load_id
            return index

        def read_data(self, plan, planner):
            read_items(self, plan, planner, shapes)
            done = torch.futures.Future()
            done.set_result(None)
            return done

    # both of the reader's reads are the door's above: DCP's own file system opens nothing
    return CheckedReader(str(Path(path) / SHARDS))


# ------------------------------------------------------------------------ what is saved


def _tensors_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """({key: tensor}, the optimizer's state dict) as this process holds them (DTensor slices
    under FSDP). Tied copies are left out, as in a single-file checkpoint."""
    helpers = _helpers()
    weights = helpers.get_model_state_dict(model)
    drop = ckpt.tied_copies(model)
    state = helpers.get_optimizer_state_dict(model, optimizer)
    tensors = {f"model/{n}": t for n, t in weights.items() if n not in drop}
    for name, entries in state["state"].items():
        for entry, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{name}/{entry}"] = value
    return tensors, state


def _record(state: dict[str, Any], scheduler_state: dict | None) -> dict[str, Any]:
    entries = {
        str(name): {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
        for name, values in state["state"].items()
    }
    entries = {name: values for name, values in entries.items() if values}
    return {
        "format": FORMAT,
        "param_groups": state["param_groups"],
        "entries": entries,
        "scheduler": scheduler_state,
    }


def hash_shards_written_by(folder: Path, rank: int) -> dict[str, str]:
    """sha256 of the shard files process ``rank`` wrote (DCP's file writer names them
    ``__<rank>_<n>.distcp``): each process hashes its own, while the others hash theirs."""
    return {f"{SHARDS}/{p.name}": ckpt.file_sha256(p) for p in folder.glob(f"__{rank}_*.distcp")}


def digests_from_every_process(own: dict[str, str]) -> dict[str, str]:
    """Every process's shard digests merged, on every process (a collective)."""
    if not _distributed():
        return own
    every: list[dict[str, str] | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, own)
    return {name: digest for part in every for name, digest in (part or {}).items()}


def save_sharded_checkpoint(
    root: Path,
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer,
    state: dict[str, Any],
    scheduler_state: dict[str, Any] | None,
    keep_last: int = 0,
    protect: tuple[Path, ...] = (),
) -> Path:
    """Write ``root/step_{step}`` with every process writing its own shards; a collective
    (every process calls it). Returns the checkpoint's path."""
    rank = _rank()
    final = root / ckpt.checkpoint_name(step)
    staging = root / f".{final.name}.sharded"
    if rank == 0:
        door.make_folders(root)
        for stale in root.glob(".step_*"):  # left by a save that died
            door.remove_tree(stale)
        door.make_folders(staging / SHARDS)
    _barrier()
    failed = None
    try:
        tensors, optim_state = _tensors_of(model, optimizer)
        # the reader takes every record for a contiguous tensor (shared.sharded_blobs)
        tensors = {key: tensor.contiguous() for key, tensor in tensors.items()}
        writer = _index_writer(staging / SHARDS)
        with _quiet():
            _dcp().save(tensors, storage_writer=writer)
        digests = digests_from_every_process(hash_shards_written_by(staging / SHARDS, rank))
        if rank == 0:
            _finish(staging, final, digests, step, tokenizer, state, optim_state, scheduler_state)
    except BaseException as error:  # every rank still meets the barrier below
        failed = error
    _barrier()
    if failed is not None:
        if rank == 0:
            door.remove_tree(staging)
        raise failed
    if rank == 0 and keep_last > 0:
        kept = {Path(p).resolve() for p in protect}
        for old in ckpt.list_checkpoints(root)[:-keep_last]:
            if old.resolve() not in kept:
                door.remove_tree(old)
    return final


def _finish(staging, final, digests, step, tokenizer, state, optim_state, scheduler_state):
    """Rank 0: the JSON records, the tokenizer and the manifest, then the rename."""
    kill_now_if("kill_in_checkpoint", step)  # tests: a crash in the middle of a save
    door.write_atomic(staging / OPTIMIZER_RECORD, json.dumps(_record(optim_state, scheduler_state)))
    door.write_atomic(staging / RNG_RECORD, json.dumps(rng_record(rng_state())))
    record = {"step": step, **state, "checkpoint_format": "sharded"}
    door.write_atomic(staging / "state.json", json.dumps(record, indent=2))
    tokenizer.save(staging / "tokenizer")
    files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
    shards = {n for n in files if n.startswith(f"{SHARDS}/") and n not in (METADATA, INDEX)}
    missing = shards - set(digests)
    if missing:
        raise CheckpointError(f"{final}: shards no process hashed: {sorted(missing)}")
    # each process hashed the shards it wrote; rank 0 hashes only the records and the indexes
    manifest = {n: digests[n] if n in shards else ckpt.file_sha256(staging / n) for n in files}
    door.write_atomic(staging / ckpt.MANIFEST, json.dumps(manifest, indent=2))
    door.follow_umask(staging)
    fsync_tree(staging)
    retired = staging.with_name(f"{staging.name}.retired")
    if final.exists():
        door.rename(final, retired)
    door.rename(staging, final)
    fsync_dir(final.parent)
    door.remove_tree(retired)


# ------------------------------------------------------------------------ resuming


def load_sharded_training_state(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> None:
    """Weights, optimizer, scheduler and generator states from a sharded checkpoint into the
    (wrapped, possibly sharded) ``model`` and its ``optimizer``; every process calls it."""
    path = Path(path)
    check_training_state(path)
    record = read_optimizer_record(path)
    rng = read_rng_state(path)
    index = read_index(path)
    helpers = _helpers()
    tensors, optim_state = _tensors_of(model, optimizer)
    refuse_uncovered(path, index, tensors)
    load_checked(path, index, tensors)
    weights = {name[len("model/") :]: t for name, t in tensors.items() if name.startswith("model/")}
    helpers.set_model_state_dict(model, weights, options=helpers.StateDictOptions(strict=False))
    optim_state["param_groups"] = record["param_groups"]
    for name, entries in record.get("entries", {}).items():
        optim_state["state"].setdefault(name, {}).update(entries)
    helpers.set_optimizer_state_dict(model, optimizer, optim_state)
    if scheduler is not None and record.get("scheduler") is not None:
        scheduler.load_state_dict(record["scheduler"])
    restore_rng_state(rng)


def load_checked(path: Path, index: Any, tensors: dict[str, torch.Tensor], **options) -> None:
    """DCP's load of ``tensors`` from the shards of ``path`` through ``_checked_reader``. DCP
    wraps whatever a process raised in its CheckpointException (a traceback per process): a
    CheckpointError among them is raised as its one line, a stop (Ctrl-C) as itself, and
    anything else says the shards do not fit."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _quiet():
            _dcp().load(tensors, storage_reader=_checked_reader(path, index), **options)
    except CheckpointException as wrapped:
        raised = [failure for failure, _ in wrapped.failures.values()]
        for error in raised:
            if isinstance(error, CheckpointError) or not isinstance(error, Exception):
                raise error from None
        raise CheckpointError(f"{path}: its shards do not fit this model ({raised[0]})") from None
    except (RuntimeError, ValueError, KeyError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"{path}: its shards do not fit this model ({error})") from None


def refuse_uncovered(path: Path, index: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Every tensor the model and optimizer hold must be in the index with its shape and type:
    one left out would keep its fresh initial values in a run that says it resumed."""
    for key, tensor in tensors.items():
        meta = index.state_dict_metadata.get(key)
        if meta is None:
            raise CheckpointError(f"{path}: its shards hold no {key}; this is not this model's")
        if tuple(meta.size) != tuple(tensor.shape) or meta.properties.dtype != tensor.dtype:
            raise CheckpointError(
                f"{path}: its {key} is {meta.properties.dtype} {tuple(meta.size)}, this model's "
                f"is {tensor.dtype} {tuple(tensor.shape)}"
            )


# ------------------------------------------------------------------------ to one file


def write_streamed(file: Path, shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]], read):
    """A safetensors file of the tensors ``shapes`` describes, each made by ``read(name)`` when
    its turn comes and dropped after: the header is known up front, so only one tensor is held
    at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in shapes.items():
        size = dtype.itemsize * int(torch.Size(shape).numel())
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes

    def write(handle) -> None:
        handle.write(struct.pack("<Q", len(text)) + text)
        for name, (dtype, shape) in shapes.items():
            tensor = read(name)
            if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
                raise CheckpointError(f"{file}: {name} read back as another shape or type")
            handle.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

    door.write_new_file(file, write)


def to_single_file(path: Path, staging: Path) -> None:
    """Write the single-file form of the sharded checkpoint ``path`` into ``staging`` (its
    weights and optimizer tensors as safetensors, its records copied, a new manifest). Holds
    one whole tensor at a time (DCP reads its slices from every shard file into it)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    ckpt.verify_checkpoint(path)
    index = read_index(path)
    shapes = {
        key: (meta.properties.dtype, tuple(meta.size))
        for key, meta in sorted(index.state_dict_metadata.items())
        if isinstance(meta, TensorStorageMetadata)
    }

    def read(key: str) -> torch.Tensor:
        dtype, shape = shapes[key]
        tensor = {key: torch.empty(shape, dtype=dtype)}
        load_checked(path, index, tensor, no_dist=True)
        return tensor[key]

    weights = {k[len("model/") :]: v for k, v in shapes.items() if k.startswith("model/")}
    moments = {k[len("optimizer/") :]: v for k, v in shapes.items() if k.startswith("optimizer/")}
    write_streamed(staging / "model.safetensors", weights, lambda n: read(f"model/{n}"))
    write_streamed(staging / OPTIMIZER_TENSORS, moments, lambda n: read(f"optimizer/{n}"))
    for name in (OPTIMIZER_RECORD, RNG_RECORD):
        door.copy_file(path / name, staging / name, path)
    door.copy_tree(path / "tokenizer", staging / "tokenizer", path)
    state = ckpt.read_state(path)
    state.pop("checkpoint_format", None)
    door.write_atomic(staging / "state.json", json.dumps(state, indent=2))
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(staging)): ckpt.file_sha256(p) for p in files}
    door.write_atomic(staging / ckpt.MANIFEST, json.dumps(manifest, indent=2))
