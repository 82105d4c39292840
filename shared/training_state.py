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
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from shared import door
from shared.door import read_json_file
from shared.errors import CheckpointError
from shared.tensor_files import save_tensors

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


# ---------------------------------------------------------------- checking what was received
#
# A received record is checked field by field before anything uses it: a value out of range
# (a word of 2**100 in a generator state, a NaN learning rate, a step count of 10**30) would
# otherwise start the run and fail in the middle of it, or train on garbage.

MT_WORDS = 624  # the Mersenne Twister's state: 624 32-bit words and a position in [0, 624]
WORD_END = 2**32
INT64_END = 2**63


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return -INT64_END < value < INT64_END if isinstance(value, int) else math.isfinite(value)


def shown(value: Any) -> str:
    """``value`` in a message, cut short (a crafted field may be thousands of characters)."""
    if is_integer(value) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refuse_field(file: Path, field: str, value: Any, wanted: str) -> CheckpointError:
    return CheckpointError(f"{file}: {field} is {shown(value)}; it must be {wanted}")


def check_words(values: Any, file: Path, field: str, count: int) -> None:
    """``values`` must be ``count`` 32-bit words."""
    if not isinstance(values, list) or len(values) != count:
        size = f"a list of {len(values)}" if isinstance(values, list) else type(values).__name__
        raise CheckpointError(f"{file}: {field} is {size}; it must be a list of {count} words")
    for i, word in enumerate(values):
        if not (is_integer(word) and 0 <= word < WORD_END):
            raise refuse_field(file, f"{field}[{i}]", word, "a 32-bit word (0 <= w < 2**32)")


def check_integer(value: Any, file: Path, field: str, low: int, high: int) -> None:
    if not (is_integer(value) and low <= value <= high):
        raise refuse_field(file, field, value, f"an integer from {low} to {high}")


def check_rng_fields(record: dict[str, Any], file: Path) -> None:
    """The ranges of every field of an ``rng_record``, each refusal naming the field."""
    for field in ("torch", "numpy", "python"):
        if field not in record:
            raise CheckpointError(f"{file}: no {field} generator state")
    devices = record.get("cuda", [])
    hex_fields = [("torch", record["torch"])]
    if not isinstance(devices, list):
        raise refuse_field(file, "cuda", devices, "a list of generator states")
    hex_fields += [(f"cuda[{i}]", state) for i, state in enumerate(devices)]
    for field, text in hex_fields:
        try:
            bytes.fromhex(text)
        except (TypeError, ValueError):
            raise refuse_field(file, field, text, "a generator state in hexadecimal") from None
    numpy_state, python_state = record["numpy"], record["python"]
    if not isinstance(numpy_state, dict) or not isinstance(python_state, dict):
        raise CheckpointError(f"{file}: numpy and python must be objects of generator fields")
    if numpy_state.get("bit_generator") != "MT19937":
        raise refuse_field(file, "numpy.bit_generator", numpy_state.get("bit_generator"), "MT19937")
    check_words(numpy_state.get("key"), file, "numpy.key", MT_WORDS)
    check_integer(numpy_state.get("pos"), file, "numpy.pos", 0, MT_WORDS)
    check_integer(numpy_state.get("has_gauss"), file, "numpy.has_gauss", 0, 1)
    if not is_finite_number(numpy_state.get("cached_gaussian")):
        raise refuse_field(
            file, "numpy.cached_gaussian", numpy_state.get("cached_gaussian"), "a finite number"
        )
    check_integer(python_state.get("version"), file, "python.version", 3, 3)
    words = python_state.get("state")
    check_words(words[:-1] if isinstance(words, list) else words, file, "python.state", MT_WORDS)
    check_integer(words[-1], file, f"python.state[{MT_WORDS}]", 0, MT_WORDS)
    gauss = python_state.get("gauss_next")
    if gauss is not None and not is_finite_number(gauss):
        raise refuse_field(file, "python.gauss_next", gauss, "null or a finite number")


def check_generators_take(state: dict[str, Any], file: Path) -> None:
    """Give the states to generators of their own (never the process's): whatever else a
    library refuses is refused here, before the run starts."""
    try:
        torch.Generator().set_state(state["torch"])
    except (RuntimeError, TypeError, ValueError) as error:
        raise CheckpointError(f"{file}: torch is not a generator state ({error})") from None
    for field, restore in (
        ("numpy", np.random.RandomState().set_state),
        ("python", random.Random().setstate),
    ):
        try:
            restore(state[field])
        except (TypeError, ValueError, OverflowError) as error:
            raise CheckpointError(f"{file}: {field} is not a generator state ({error})") from None


def rng_from_record(record: Any, file: Path) -> dict[str, Any]:
    """The inverse of ``rng_record``, checked: a record of another shape, or with a value out
    of its range, is refused naming the field."""
    if not isinstance(record, dict):
        raise CheckpointError(f"{file}: not a random-generator state")
    check_rng_fields(record, file)
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
    check_generators_take(state, file)
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


# AdamW's settings in each parameter group: the range of each number, the switches' kinds
GROUP_RATES = ("lr", "initial_lr", "weight_decay", "eps")  # finite and >= 0
GROUP_SWITCHES = ("amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")
GROUP_CHOICES = ("foreach", "fused")  # a switch or null (torch decides)


def check_numbers(value: Any, file: Path, field: str) -> None:
    """Every number in ``value`` (nested in lists and objects) is finite and fits 64 bits.
    (A loop, not recursion: the record may be nested nearly as deep as Python recurses.)"""
    pending = [(field, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, dict):
            pending += [(f"{where}.{key}".lstrip("."), inner) for key, inner in item.items()]
        elif isinstance(item, list):
            pending += [(f"{where}[{i}]", inner) for i, inner in enumerate(item)]
        elif isinstance(item, int | float) and not isinstance(item, bool):
            if not is_finite_number(item):
                raise refuse_field(file, where, item, "a finite number that fits 64 bits")


def check_group(group: dict[str, Any], file: Path, field: str) -> None:
    for name in GROUP_RATES:
        if name in group and not (is_finite_number(group[name]) and group[name] >= 0):
            raise refuse_field(file, f"{field}.{name}", group[name], "a finite number >= 0")
    if "betas" in group:
        betas = group["betas"]
        if not (
            isinstance(betas, list)
            and len(betas) == 2
            and all(is_finite_number(b) and 0 <= b < 1 for b in betas)
        ):
            raise refuse_field(file, f"{field}.betas", betas, "two numbers in [0, 1)")
    for name in GROUP_SWITCHES:
        if name in group and not isinstance(group[name], bool):
            raise refuse_field(file, f"{field}.{name}", group[name], "true or false")
    for name in GROUP_CHOICES:
        if group.get(name) is not None and not isinstance(group[name], bool):
            raise refuse_field(file, f"{field}.{name}", group[name], "true, false or null")


def check_optimizer_record(record: dict[str, Any], file: Path) -> None:
    """The numbers of an optimizer record: every one finite (a NaN or infinite rate, moment
    or step count would train on garbage or fail mid-run), AdamW's settings in range, the
    scheduler's step a count."""
    check_numbers(record, file, "")
    groups = record.get("param_groups")
    if isinstance(groups, list):
        for i, group in enumerate(groups):
            if isinstance(group, dict):
                check_group(group, file, f"param_groups[{i}]")
    scheduler = record.get("scheduler")
    if isinstance(scheduler, dict):
        if "last_epoch" in scheduler:
            check_integer(scheduler["last_epoch"], file, "scheduler.last_epoch", -1, INT64_END - 1)
        for name in ("base_lrs", "_last_lr"):
            rates = scheduler.get(name, [])
            if not isinstance(rates, list) or not all(
                is_finite_number(r) and r >= 0 for r in rates
            ):
                raise refuse_field(file, f"scheduler.{name}", rates, "a list of numbers >= 0")


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
        door.write_atomic(folder / OPTIMIZER_RECORD, json.dumps(record, indent=2))
        written += [OPTIMIZER_TENSORS, OPTIMIZER_RECORD]
    door.write_atomic(folder / RNG_RECORD, json.dumps(rng_record(rng)))
    return written + [RNG_RECORD]


def _read_json(file: Path) -> Any:
    try:
        return read_json_file(file, CheckpointError, allow_nan=True)  # checked field by field
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing") from None


def _read_record(file: Path) -> dict[str, Any]:
    record = _read_json(file)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a format-{FORMAT} record of this project")
    return record


def read_optimizer_record(folder: Path) -> dict[str, Any]:
    """A checkpoint's optimizer.json, checked (``check_optimizer_record``)."""
    record_file = folder / OPTIMIZER_RECORD
    record = _read_record(record_file)
    check_optimizer_record(record, record_file)
    _parameter_ids(record.get("param_groups"), record_file)
    _check_scheduler(record.get("scheduler"), record_file)
    return record


def read_optimizer_state(folder: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the name-keyed optimizer state, the scheduler state) of a checkpoint."""
    tensors_file, record_file = folder / OPTIMIZER_TENSORS, folder / OPTIMIZER_RECORD
    if not tensors_file.is_file():
        raise CheckpointError(
            f"{folder}: no {OPTIMIZER_TENSORS}: a checkpoint of weights only (an import?) cannot "
            "be resumed; start a run from its weights with --init-from"
        )
    record = read_optimizer_record(folder)
    try:
        with door.opened_path(tensors_file, folder, error=CheckpointError) as name:
            tensors = load_file(name)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{tensors_file}: unreadable safetensors file ({error})") from None
    return join_optimizer_state(tensors, record, record_file), record.get("scheduler")


def read_rng_state(folder: Path) -> dict[str, Any]:
    return rng_from_record(_read_record(folder / RNG_RECORD), folder / RNG_RECORD)
