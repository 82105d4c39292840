"""``duolm convert-checkpoint``: the pickled training state of checkpoints written by earlier
releases (``optimizer.pt``, ``rng.pt``) rewritten as the files this release resumes from
(``shared.training_state``: safetensors and JSON).

    duolm convert-checkpoint runs/old-mdm --trust                    # every checkpoint of a run
    duolm convert-checkpoint runs/old-mdm/checkpoints/step_000012 --trust

Reading a pickle can run code, so it happens only here, once the user says they trust the
checkpoint (``--trust``), and even then through torch's restricted unpickler
(``weights_only=True``) allowing, beyond tensors and plain containers, only the one object those
files held: NumPy's generator state. A file that needs anything else is refused, naming it and
what it asked for, and nothing of it runs.

A sharded checkpoint of an earlier version holds its index only as DCP's pickle
(``shards/.metadata``); ``--trust`` also reads that, through torch's own weights-only unpickler
allowing DCP's index classes only, and writes the JSON index this version reads
(``shards/index.json``, ``shared.sharded_index``), checked as every read checks it.

``--to single`` instead turns a sharded checkpoint (``shared.sharded_checkpoint``) into a
single-file one, the format of export, import, evaluation and sampling, one tensor at a time:

    duolm convert-checkpoint runs/big/checkpoints/step_004000 --to single

A checkpoint is converted in place: its new files are staged beside it and moved in, its
manifest is rewritten to list them instead of the pickles, and only then are the pickles
removed; a conversion that stops half-way leaves the checkpoint as it was, to convert again.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import _weights_only_unpickler

from shared import door
from shared.checkpoint import (
    CHECKPOINT_PATTERN,
    MANIFEST,
    SHARDS,
    file_sha256,
    is_sharded_checkpoint,
    list_checkpoints,
    read_manifest,
    verify_checkpoint,
)
from shared.cli_args import CommandParser
from shared.door import fsync_dir, fsync_tree, write_atomic
from shared.errors import CheckpointError, ConfigError, report_user_errors
from shared.sharded_checkpoint import to_single_file
from shared.sharded_index import (
    INDEX,
    INDEX_LIMIT,
    METADATA,
    checked_index,
    index_record,
    index_text,
    shard_sizes,
)
from shared.training.run_folder import holder_if_locked
from shared.training_state import (
    PICKLED_FILES,
    read_optimizer_state,
    read_rng_state,
    write_training_state,
)

OPTIMIZER_PICKLE, RNG_PICKLE = PICKLED_FILES

# ``np.random.get_state()`` is a tuple holding a uint32 array, which pickles as the function
# NumPy rebuilds arrays with (taken from an array's own pickling recipe: NumPy 1 and 2 keep it in
# differently named modules, and a pickle names the module of the NumPy that wrote it).
_reconstruct = np.zeros(0).__reduce__()[0]
NUMPY_RNG_GLOBALS = [
    (_reconstruct, "numpy.core.multiarray._reconstruct"),
    (_reconstruct, "numpy._core.multiarray._reconstruct"),
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
]

WHAT_CONVERTING_DOES = (
    "converting unpickles the checkpoint's optimizer.pt and rng.pt, or a sharded checkpoint's "
    "shards/.metadata (Python pickles, which can run code when read; the reader admits only "
    "tensors, numbers, NumPy's generator state and DCP's index classes) and rewrites them as "
    "safetensors and JSON; if you trust where {path} came from, run it again with --trust"
)


def read_pickled(file: Path) -> Any:
    """A pickle written by ``torch.save`` in an earlier release, through the restricted
    unpickler; one that asks for any other object is refused before that object is made."""
    try:
        with torch.serialization.safe_globals(NUMPY_RNG_GLOBALS):
            with door.open_read(file, error=CheckpointError) as handle:
                return torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        asked = re.search(r"GLOBAL (\S+)", str(error))
        what = f"it asks for {asked.group(1)}" if asked else str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"{file}: refused to unpickle: {what}, which no checkpoint of this project holds"
        ) from None
    except (OSError, RuntimeError, EOFError) as error:
        raise CheckpointError(f"{file}: unreadable ({error})") from None


def read_pickled_state(path: Path, listed: dict[str, str]) -> dict[str, Any]:
    """The training state of an earlier release's checkpoint: the optimizer and scheduler
    state (absent in an import) and the generators' states."""
    if RNG_PICKLE not in listed:
        raise CheckpointError(f"{path}: {OPTIMIZER_PICKLE} without {RNG_PICKLE} in its {MANIFEST}")
    state: dict[str, Any] = {"optimizer_state": None, "scheduler_state": None}
    if OPTIMIZER_PICKLE in listed:
        blob = read_pickled(path / OPTIMIZER_PICKLE)
        if not isinstance(blob, dict) or "optimizer" not in blob:
            raise CheckpointError(f"{path / OPTIMIZER_PICKLE}: not an optimizer state")
        state |= {"optimizer_state": blob["optimizer"], "scheduler_state": blob.get("scheduler")}
    state["rng"] = read_pickled(path / RNG_PICKLE)
    return state


def _index_globals() -> list[Any]:
    """What torch's weights-only unpickler may make, beyond tensors, sizes and dtypes, in DCP's
    pickled index: its classes (BUILD on their instances only, never on a class). No path: the
    indexes this project wrote record none, and a path object is what a crafted pickle would
    use to name one file while opening another."""
    from torch.distributed.checkpoint import filesystem, metadata

    return [
        metadata.Metadata,
        metadata.TensorStorageMetadata,
        metadata.TensorProperties,
        metadata.ChunkStorageMetadata,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        metadata._MEM_FORMAT_ENCODING,
        filesystem._StorageInfo,
    ]


def unpickle_index(data: bytes, file: Path) -> Any:
    """DCP's pickled index through torch's own pure-Python weights-only unpickler (the one
    ``torch.load(weights_only=True)`` uses), allowing only ``_index_globals``. The enum
    ``_MEM_FORMAT_ENCODING`` is one object per member for the whole process, and BUILD on a
    member would change it there: a pickle that does so is refused and the members restored."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING as encodings

    if data[:1] == b"\x80" and len(data) > 1 and data[1] > 2:
        raise CheckpointError(
            f"{file}: pickled at protocol {data[1]}; indexes of this project were pickled at "
            "protocol 2 (torch's weights-only unpickler)"
        )
    members = {member: (type(member), dict(vars(member))) for member in encodings}
    try:
        with torch.serialization.safe_globals(_index_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on the protocol, said above instead
            index = _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="ASCII").load()
    except Exception as error:  # noqa: BLE001 - any failure of a crafted pickle is a refusal
        restore_members(members)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        asked = re.search(r"GLOBAL (\S+)", reason)
        what = f"it asks for {asked.group(1)}" if asked else reason[:200]
        raise CheckpointError(
            f"{file}: refused to unpickle: {what}, which no index of a sharded checkpoint holds"
        ) from None
    changed = restore_members(members)
    if changed:
        raise CheckpointError(
            f"{file}: refused: unpickling it changed DCP's {', '.join(changed)} for the whole "
            "process (changed back); no index of a sharded checkpoint does that"
        )
    return index


def restore_members(members: dict[Any, tuple[type, dict]]) -> list[str]:
    """The names of the enum members whose class or attributes differ from ``members`` (as they
    were), each set back."""
    changed = []
    for member, (kind, attributes) in members.items():
        if type(member) is not kind or vars(member) != attributes:
            changed.append(f"{kind.__name__}.{attributes.get('_name_', '?')}")
            member.__class__ = kind
            vars(member).clear()
            vars(member).update(attributes)
    return changed


def write_json_index(path: Path, listed: dict[str, str]) -> None:
    """Write ``shards/index.json`` for a sharded checkpoint of an earlier version, from its
    pickled ``shards/.metadata``, checked as a resume will check it, then list it in the
    manifest; stopped half-way, the checkpoint is as it was (the new file not yet listed)."""
    file = path / METADATA
    data = door.read_bytes(file, path, error=CheckpointError, limit=INDEX_LIMIT)
    index = unpickle_index(data, file)
    try:
        record = index_record(index)
    except (ValueError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{file}: not an index of a sharded checkpoint ({error})") from None
    checked_index(record, file, shard_sizes(path, listed))
    write_atomic(path / INDEX, index_text(record), durable=True)
    fsync_dir(path / SHARDS)
    manifest = dict(sorted((listed | {INDEX: file_sha256(path / INDEX)}).items()))
    write_atomic(path / MANIFEST, json.dumps(manifest, indent=2), durable=True)
    fsync_dir(path)


def convert_checkpoint(path: Path) -> bool:
    """Convert one checkpoint in place; False when it needed no conversion."""
    verify_checkpoint(path)  # a damaged checkpoint is not given a fresh manifest
    listed = read_manifest(path)
    pickled_index = METADATA in listed and INDEX not in listed
    if pickled_index:
        write_json_index(path, listed)
        listed = read_manifest(path)
    if not any(name in listed for name in PICKLED_FILES):
        return pickled_index
    convert_training_state(path, listed)
    return True


def convert_training_state(path: Path, listed: dict[str, str]) -> None:
    """``optimizer.pt`` and ``rng.pt`` of ``path`` rewritten as safetensors and JSON."""
    state = read_pickled_state(path, listed)
    # staged as ".step_NNNNNN.*", which checkpoint listings skip and the next save clears
    staging = door.make_temp_folder(path.parent, f".{path.name}.convert.")
    try:
        try:
            written = write_training_state(staging, **state)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(
                f"{path}: its pickles hold no training state of this project ({error!r})"
            ) from None
        read_back(staging, with_optimizer=state["optimizer_state"] is not None)
        door.follow_umask(staging)
        fsync_tree(staging)
        for name in written:
            door.replace(staging / name, path / name)
        fsync_dir(path)
        kept = {name: digest for name, digest in listed.items() if name not in PICKLED_FILES}
        manifest = dict(sorted((kept | {n: file_sha256(path / n) for n in written}).items()))
        write_atomic(path / MANIFEST, json.dumps(manifest, indent=2), durable=True)
        fsync_dir(path)
    finally:
        door.remove_tree(staging)
    for name in PICKLED_FILES:
        door.remove_file(path / name)
    fsync_dir(path)


def read_back(folder: Path, *, with_optimizer: bool) -> None:
    """Read the written files as a resume will, so that a conversion a resume would refuse
    stops before it touches the checkpoint."""
    if with_optimizer:
        read_optimizer_state(folder)
    read_rng_state(folder)


def checkpoints_at(path: Path) -> list[Path]:
    """The checkpoint ``path`` names, or every checkpoint of a run or checkpoints folder."""
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    if (path / MANIFEST).exists() or CHECKPOINT_PATTERN.match(path.name):
        return [path]
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = list_checkpoints(root)
    if not found:
        raise CheckpointError(f"no checkpoints found under {root}")
    return found


def sharded_to_single(path: Path) -> bool:
    """Replace the sharded checkpoint ``path`` by its single-file form; False when it is one
    already. Staged beside it and swapped in by renames: a reader sees one or the other."""
    if not is_sharded_checkpoint(path):
        verify_checkpoint(path)
        return False
    staging = door.make_temp_folder(path.parent, f".{path.name}.convert.")
    retired = staging.with_name(f"{staging.name}.retired")
    try:
        to_single_file(path, staging)
        door.follow_umask(staging)
        fsync_tree(staging)
        door.rename(path, retired)
        door.rename(staging, path)
        fsync_dir(path.parent)
    except BaseException:
        if retired.exists() and not path.exists():
            door.rename(retired, path)
        door.remove_tree(staging)
        raise
    door.remove_tree(retired)
    return True


def convert(path: Path, log=print, to_single: bool = False) -> int:
    """Convert every checkpoint at ``path``; returns how many needed it. One that cannot be
    converted is named and the others still are; a run folder in use by a live run is refused
    (it may be writing or pruning checkpoints)."""
    checkpoints = checkpoints_at(path)
    run_folder = checkpoints[0].parent.parent
    holder = holder_if_locked(run_folder)
    if holder:
        raise ConfigError(f"the run folder {run_folder} is in use ({holder}); wait for it to end")
    converted, failed = 0, []
    for checkpoint in checkpoints:
        try:
            if (sharded_to_single if to_single else convert_checkpoint)(checkpoint):
                converted += 1
                log(f"converted {checkpoint}" + (" to a single-file checkpoint" * to_single))
            else:
                log(f"{checkpoint}: already " + ("single-file" if to_single else "current"))
        except CheckpointError as error:
            failed.append(error)
            if len(checkpoints) > 1:
                log(f"not converted: {error}")
    if len(failed) == 1 and len(checkpoints) == 1:
        raise failed[0]
    if failed:
        raise CheckpointError(f"{len(failed)} of {len(checkpoints)} checkpoints not converted")
    return converted


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description="Convert checkpoints written by earlier releases (training state in Python "
        "pickles: optimizer.pt, rng.pt; a sharded checkpoint's index in shards/.metadata) to "
        "the current format (safetensors and JSON), so that they resume. Reading a pickle can "
        "run code: only convert what you trust. With --to single: turn sharded checkpoints "
        "into single-file ones."
    )
    parser.add_argument("path", help="a checkpoint folder, or a run folder (all its checkpoints)")
    parser.add_argument(
        "--trust",
        action="store_true",
        help="you trust where the checkpoint came from (required: converting reads its pickles)",
    )
    parser.add_argument(
        "--to",
        choices=["single"],
        default=None,
        help="single: turn sharded checkpoints (torch.distributed.checkpoint) into single-file "
        "ones, tensor by tensor (no pickle is run: needs no --trust)",
    )
    args = parser.parse_args(argv)

    def run() -> None:
        if args.to == "single":
            convert(Path(args.path), to_single=True)
            return
        if not args.trust:
            raise ConfigError(WHAT_CONVERTING_DOES.format(path=args.path))
        convert(Path(args.path))

    return report_user_errors(run)


if __name__ == "__main__":
    sys.exit(main())
