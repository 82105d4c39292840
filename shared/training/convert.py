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

``--to single`` instead turns a sharded checkpoint (``shared.sharded_checkpoint``) into a
single-file one, the format of export, import, evaluation and sampling, one tensor at a time:

    duolm convert-checkpoint runs/big/checkpoints/step_004000 --to single

A checkpoint is converted in place: its new files are staged beside it and moved in, its
manifest is rewritten to list them instead of the pickles, and only then are the pickles
removed; a conversion that stops half-way leaves the checkpoint as it was, to convert again.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared import door
from shared.checkpoint import (
    CHECKPOINT_PATTERN,
    MANIFEST,
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
    "converting unpickles the checkpoint's optimizer.pt and rng.pt (Python pickles, which can "
    "run code when read; the reader admits only tensors, numbers and NumPy's generator state) "
    "and rewrites them as safetensors and JSON; if you trust where {path} came from, run it "
    "again with --trust"
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


def convert_checkpoint(path: Path) -> bool:
    """Convert one checkpoint in place; False when it needed no conversion."""
    verify_checkpoint(path)  # a damaged checkpoint is not given a fresh manifest
    listed = read_manifest(path)
    if not any(name in listed for name in PICKLED_FILES):
        return False
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
    return True


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
        "pickles: optimizer.pt, rng.pt) to the current format (safetensors and JSON), so "
        "that they resume. Reading a pickle can run code: only convert what you trust. With "
        "--to single: turn sharded checkpoints into single-file ones."
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
