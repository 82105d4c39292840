"""A checkpoint's training state (optimizer, LR scheduler, random generators) in files that
cannot carry code:

- ``optimizer.safetensors``  every tensor of the optimizer's state (AdamW's two moments and its
  step count, per parameter), keyed ``<parameter name>/<entry>``;
- ``optimizer.json``         the parameter groups (hyperparameters, and the names of the
  parameters in each), any per-parameter entry that is not a tensor, and the LR scheduler's
  state;
- ``rng.json``               the torch (and CUDA), NumPy and Python generator states.

Earlier releases pickled the same state into ``optimizer.pt`` and ``rng.pt`` (``PICKLED_FILES``).
Unpickling runs whatever code the file names, and a run folder is something people pass around
(whoever crafts one writes its manifest too), so a resume never reads those files:
``duolm convert-checkpoint`` rewrites them once the user says they trust them
(``shared.training.convert``). JSON and safetensors hold data only; a file here that is not
what it should be is refused with a ``CheckpointError`` naming it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from shared.errors import CheckpointError
from shared.files import save_tensors

OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_RECORD = "optimizer.json"
RNG_RECORD = "rng.json"
STATE_FILES = (OPTIMIZER_TENSORS, OPTIMIZER_RECORD, RNG_RECORD)
PICKLED_FILES = ("optimizer.pt", "rng.pt")  # what earlier releases wrote instead
FORMAT = 1  # of optimizer.json and rng.json


# ---------------------------------------------------------------- random generators


def rng_state() -> dict[str, Any]:
    """This process's generator states, in the forms their libraries give them."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_record(state: dict[str, Any]) -> dict[str, Any]:
    """``rng_state()`` as JSON: torch's byte states as hex, the Mersenne Twister words as
    integers (JSON writes a float so that it reads back exactly)."""
    bit_generator, key, position, has_gauss, cached_gaussian = state["numpy"]
    version, internal_state, gauss_next = state["python"]
    record = {
        "format": FORMAT,
        "torch": state["torch"].numpy().tobytes().hex(),
        "numpy": {
            "bit_generator": bit_generator,
            "key": [int(word) for word in key],
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {"version": version, "state": list(internal_state), "gauss_next": gauss_next},
    }
    if "cuda" in state:
        record["cuda"] = [device.numpy().tobytes().hex() for device in state["cuda"]]
    return record


def _byte_tensor(text: str) -> torch.Tensor:
    return torch.tensor(list(bytes.fromhex(text)), dtype=torch.uint8)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def rng_from_record(record: Any, file: Path) -> dict[str, Any]:
    """The inverse of ``rng_record``, checked: a record of another shape is refused."""
    try:
        numpy_state, python_state = record["numpy"], record["python"]
        state = {
            "torch": _byte_tensor(record["torch"]),
            "numpy": (
                str(numpy_state["bit_generator"]),
                np.array(numpy_state["key"], dtype=np.uint32),
                int(numpy_state["pos"]),
                int(numpy_state["has_gauss"]),
                float(numpy_state["cached_gaussian"]),
            ),
            "python": (
                int(python_state["version"]),
                tuple(int(word) for word in python_state["state"]),
                _float_or_none(python_state["gauss_next"]),
            ),
        }
        if "cuda" in record:
            state["cuda"] = [_byte_tensor(device) for device in record["cuda"]]
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise CheckpointError(f"{file}: not a random-generator state ({error!r})") from None
    return state


# ---------------------------------------------------------------- optimizer and scheduler


def split_optimizer_state(saved: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
    """(the tensors of a name-keyed optimizer state, keyed ``<parameter>/<entry>``; the rest, as
    JSON: the parameter groups and any entry that is not a tensor)."""
    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, dict[str, Any]] = {}
    for parameter, state in saved["state"].items():
        for entry, value in state.items():
            if isinstance(value, torch.Tensor):
                # safetensors wants contiguous CPU tensors that share no storage
                tensors[f"{parameter}/{entry}"] = value.detach().cpu().contiguous()
            else:
                entries.setdefault(str(parameter), {})[entry] = value
    return tensors, {"param_groups": saved["param_groups"], "entries": entries}


def _parameter_ids(groups: Any, file: Path) -> dict[str, str | int]:
    """Each parameter's identifier in the groups (a name; an index in states saved before they
    were name-keyed), by its text in the tensor keys."""
    if not isinstance(groups, list) or not all(
        isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups
    ):
        raise CheckpointError(f"{file}: param_groups is not a list of groups with their params")
    return {str(p): p for group in groups for p in group["params"] if isinstance(p, str | int)}


def join_optimizer_state(
    tensors: dict[str, torch.Tensor], record: dict[str, Any], file: Path
) -> dict[str, Any]:
    """The inverse of ``split_optimizer_state``; every entry must belong to a parameter of the
    groups."""
    ids = _parameter_ids(record.get("param_groups"), file)
    entries = record.get("entries", {})
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise CheckpointError(f"{file}: entries is not a mapping of parameters to entries")
    pieces = [(*_parameter_and_entry(key), value) for key, value in tensors.items()]
    pieces += [(p, entry, value) for p, state in entries.items() for entry, value in state.items()]
    state: dict[str | int, dict[str, Any]] = {}
    for parameter, entry, value in pieces:
        if parameter not in ids:
            raise CheckpointError(
                f"{file.parent}: optimizer state for {parameter!r}, which no parameter group holds"
            )
        state.setdefault(ids[parameter], {})[entry] = value
    return {"state": state, "param_groups": record["param_groups"]}


def _parameter_and_entry(key: str) -> tuple[str, str]:
    parameter, _, entry = key.rpartition("/")  # parameter names hold dots, never slashes
    return parameter, entry


def _check_scheduler(saved: Any, file: Path) -> None:
    """A scheduler state is plain data, and names no rate function of its own: the run's rate
    rules are its code (``LambdaLR`` saves ``None`` for them), never the checkpoint's."""
    if saved is None:
        return
    rules = saved.get("lr_lambdas", []) if isinstance(saved, dict) else None
    if not isinstance(rules, list) or any(rule is not None for rule in rules):
        raise CheckpointError(f"{file}: the scheduler state is not one this project writes")


# ---------------------------------------------------------------- files


def write_training_state(
    folder: Path,
    *,
    optimizer_state: dict[str, Any] | None,
    scheduler_state: dict[str, Any] | None,
    rng: dict[str, Any],
) -> list[str]:
    """Write the training state's files into ``folder``; returns their names. A checkpoint
    without an optimizer state (an import) has the generators' states only."""
    written = []
    if optimizer_state is not None:
        tensors, record = split_optimizer_state(optimizer_state)
        save_tensors(tensors, folder / OPTIMIZER_TENSORS)
        record = {"format": FORMAT, **record, "scheduler": scheduler_state}
        (folder / OPTIMIZER_RECORD).write_text(json.dumps(record, indent=2))
        written += [OPTIMIZER_TENSORS, OPTIMIZER_RECORD]
    (folder / RNG_RECORD).write_text(json.dumps(rng_record(rng)))
    return written + [RNG_RECORD]


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file}: not valid JSON ({error})") from None


def _read_record(file: Path) -> dict[str, Any]:
    record = _read_json(file)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a format-{FORMAT} record of this project")
    return record


def read_optimizer_state(folder: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the name-keyed optimizer state, the scheduler state) of a checkpoint."""
    tensors_file, record_file = folder / OPTIMIZER_TENSORS, folder / OPTIMIZER_RECORD
    if not tensors_file.is_file():
        raise CheckpointError(
            f"{folder}: no {OPTIMIZER_TENSORS}: a checkpoint of weights only (an import?) cannot "
            "be resumed; start a run from its weights with --init-from"
        )
    record = _read_record(record_file)
    try:
        tensors = load_file(str(tensors_file))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{tensors_file}: unreadable safetensors file ({error})") from None
    _check_scheduler(record.get("scheduler"), record_file)
    return join_optimizer_state(tensors, record, record_file), record.get("scheduler")


def read_rng_state(folder: Path) -> dict[str, Any]:
    return rng_from_record(_read_record(folder / RNG_RECORD), folder / RNG_RECORD)
