"""A stored throughput measurement read back and checked field by field before two runs are
compared (``eval.speed.throughput_runs``): a file that is not a measurement (a JSON list, a missing
field, a median that is text, NaN or outside its [min, max]) is one line naming the file and the
field, never a traceback.

    measurement = load(Path("runs/demo/stages/throughput.json"))
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from eval.speed.throughput import Record, Spread, Throughput
from shared import door
from shared.errors import ConfigError


def load(path: Path) -> Throughput:
    """A measurement as ``Throughput.as_dict`` wrote it, bare or inside a stored stage's
    ``result``; anything else is one line naming the file (and the field)."""
    try:
        text = door.read_text(path, limit=1 << 26)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file; give a throughput stage's JSON") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read a throughput measurement ({error})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise ConfigError(f"{path}: not JSON ({error}); give a throughput stage's JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a JSON {json_kind(data)}, not a throughput measurement (an object with "
            "'records'); give a throughput stage's JSON"
        )
    if isinstance(data.get("result"), dict):
        data = data["result"]
    if "records" not in data:
        raise ConfigError(f"{path}: no 'records' in it; give a throughput stage's JSON")
    try:
        return checked_measurement(data)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    kinds = ((dict, "object"), (list, "list"), (str, "string"), (bool, "boolean"))
    kinds += (((int, float), "number"),)
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def checked_measurement(data: dict[str, Any]) -> Throughput:
    """``data`` as a ``Throughput``, every field the comparison reads checked first."""
    records = checked_list(data, "records", "")
    probes = checked_list(data, "probes", "") if "probes" in data else []
    machine = data.get("machine")
    if not isinstance(machine, dict):
        raise ConfigError(f"'machine' is {describe(machine)}; expected an object")
    setup = data.get("setup", {})
    if not isinstance(setup, dict):
        raise ConfigError(f"'setup' is {describe(setup)}; expected an object")
    notes = data.get("notes", [])
    if not isinstance(notes, list):
        raise ConfigError(f"'notes' is {describe(notes)}; expected a list")
    return Throughput(
        [checked_record(r, f"records[{i}]") for i, r in enumerate(records)],
        machine,
        [str(note) for note in notes],
        [checked_record(r, f"probes[{i}]") for i, r in enumerate(probes)],
        setup,
        checked_processes(data),
    )


def checked_processes(data: dict[str, Any]) -> list[Throughput]:
    """The per-process runs a pooled measurement kept, each checked like a measurement."""
    processes = checked_list(data, "processes", "") if "processes" in data else []
    runs = []
    for index, run in enumerate(processes):
        if not isinstance(run, dict):
            raise ConfigError(f"processes[{index}] is {describe(run)}; expected an object")
        try:
            runs.append(checked_measurement({key: run[key] for key in run if key != "processes"}))
        except ConfigError as error:
            raise ConfigError(f"processes[{index}]: {error}") from None
    return runs


def describe(value: Any) -> str:
    return "missing" if value is None else f"{value!r} (a {json_kind(value)})"


def checked_list(data: dict[str, Any], field: str, where: str) -> list[Any]:
    value = data.get(field)
    if not isinstance(value, list):
        raise ConfigError(f"'{where}{field}' is {describe(value)}; expected a list")
    return value


def field_of(record: dict[str, Any], field: str, where: str) -> Any:
    if field not in record:
        raise ConfigError(f"{where} has no field '{field}'")
    return record[field]


def checked_integer(record: dict[str, Any], field: str, where: str, least: int) -> int:
    value = field_of(record, field, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{where}.{field} is {value!r}; expected an integer >= {least}")
    return value


def checked_number(value: Any, where: str) -> float:
    """A finite JSON number (NaN and infinities, which Python's json reads, are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} is {describe(value)}; expected a number")
    if not math.isfinite(value):
        raise ConfigError(f"{where} is {value}; expected a finite number")
    return float(value)


def checked_spread(record: dict[str, Any], field: str, where: str) -> Spread:
    """A median with its [low, high]: finite numbers, 0 <= low <= median <= high, the median
    above 0 (the comparison divides by it)."""
    spread = field_of(record, field, where)
    if not isinstance(spread, dict):
        raise ConfigError(f"{where}.{field} is {describe(spread)}; expected an object")
    median, low, high = (
        checked_number(field_of(spread, key, f"{where}.{field}"), f"{where}.{field}.{key}")
        for key in ("median", "low", "high")
    )
    if not low <= median <= high:
        raise ConfigError(
            f"{where}.{field}: median {median:g} outside [low {low:g}, high {high:g}]; expected "
            "low <= median <= high"
        )
    if low < 0:
        raise ConfigError(f"{where}.{field}.low is {low:g}; a speed cannot be below 0")
    if median == 0:
        raise ConfigError(f"{where}.{field}.median is 0; the ratio of medians needs it above 0")
    return Spread(median, low, high)


def checked_record(record: Any, where: str) -> Record:
    """One record of a measurement, checked field by field."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where} is {describe(record)}; expected an object")
    name = field_of(record, "name", where)
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name is {describe(name)}; expected text")
    round_tokens = field_of(record, "round_tokens", where)
    if not isinstance(round_tokens, list) or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in round_tokens
    ):
        raise ConfigError(
            f"{where}.round_tokens is {round_tokens!r}; expected a list of integers >= 0"
        )
    round_seconds = field_of(record, "round_seconds", where)
    if not isinstance(round_seconds, list):
        raise ConfigError(f"{where}.round_seconds is {describe(round_seconds)}; expected a list")
    positions = record.get("positions", [])
    return Record(
        name=name,
        batch_size=checked_integer(record, "batch_size", where, 1),
        rounds=checked_integer(record, "rounds", where, 1),
        warmup=checked_integer(record, "warmup", where, 0),
        tokens_per_s=checked_spread(record, "tokens_per_s", where),
        seconds_per_sample=checked_spread(record, "seconds_per_sample", where),
        round_seconds=[checked_number(t, f"{where}.round_seconds") for t in round_seconds],
        round_tokens=round_tokens,
        positions=positions if isinstance(positions, list) else [],
    )
