"""Two runs of the same throughput measurement compared: did the tokens/s reproduce, and if not,
did the host change speed or did the measurement?

    python -m eval.throughput_runs runs/a/stages/throughput.json runs/b/stages/throughput.json

For every batch size both runs measured:

- each setting's medians and whether each lies inside the other run's [min, max] (the spread
  the report states), and the ratio of medians second / first, with its min, median and max over
  the settings;
- the same for the host probes (``eval.throughput.host_probes``), which measure the machine and
  not a model;
- a verdict: ``reproduced`` when every setting's median lies inside the other run's spread;
  otherwise ``host changed speed`` when a probe's median also left the other run's spread, in
  the direction the settings moved (the ratio of medians over the settings, above or below 1):
  the machine itself ran at another speed, so the pair cannot test the measurement; and ``not
  reproduced`` when no probe moved that way (the host held still, or moved the other way, and
  the measurement moved); ``not reproduced (no host probes)`` for runs measured before the
  probes existed.

A [min, max] over 5 rounds covers the noise within a run, not the drift between runs, so the
summary also gives how close the runs came: the ratio of medians, median [min, max] over the
settings.

Only two runs of the same measurement are compared: runs whose recorded setups differ (the
preset, a model's shape, the generation length or prompt, the sampler settings: ``SAME_SETUP``),
that ran with different torch threads, or in which a setting generated a different number of
tokens per sample, are refused with one line naming what differs; so is a pair in which only one
run records its setup (measured before the setup was recorded: rerun its throughput stage).
Neither recording it (older runs) is compared on what the records show, and the output says so.
A file that is not a measurement (a JSON list, a missing field, a median that is text, NaN or
outside its [min, max]) is one line naming the file and the field; user errors exit with status
2.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.throughput import Record, Spread, Throughput
from shared.cli_args import CommandParser, writable_file
from shared.errors import ConfigError, report_user_errors
from shared.files import write_atomic

REPRODUCED = "reproduced"
HOST_CHANGED = "host changed speed"
NOT_REPRODUCED = "not reproduced"
NO_PROBES = "not reproduced (no host probes)"

# The setup fields two runs must share to be runs of the same measurement (what sets the speed
# of a setting of a given name). Batch sizes are compared one by one (those both runs measured),
# and the rounds, warm-up and processes only repeat the measurement, so they may differ.
SAME_SETUP = (
    "preset",
    "models",
    "gen_length",
    "prompt",
    "eos",
    "temperatures",
    "diffusion_steps",
    "bd_block_size",
)
NO_SETUP_NOTE = (
    "Neither run records its setup (preset, model shapes, lengths, sampler settings; measured "
    "before it was recorded): only the settings' names, the tokens each generated per sample and "
    "the torch threads were checked to match."
)


@dataclass(frozen=True)
class Pair:
    """One setting (or probe) at one batch size in both runs."""

    name: str
    batch_size: int
    first: Spread
    second: Spread

    @property
    def ratio(self) -> float:
        """Median tokens/s of the second run over the first's."""
        return self.second.median / self.first.median

    @property
    def within(self) -> bool:
        """Each run's median lies inside the other run's [min, max]."""
        return inside(self.first.median, self.second) and inside(self.second.median, self.first)


@dataclass(frozen=True)
class BatchAgreement:
    batch_size: int
    settings: list[Pair]
    probes: list[Pair]
    verdict: str

    def ratio_spread(self) -> Spread:
        return Spread.of([p.ratio for p in self.settings])

    @property
    def settings_within(self) -> int:
        """How many settings' medians lie inside each other's spread."""
        return sum(p.within for p in self.settings)


def inside(value: float, spread: Spread) -> bool:
    return spread.low <= value <= spread.high


def pairs(first: list[Record], second: list[Record], batch: int) -> list[Pair]:
    """Records of one batch size present in both runs, in the first run's order."""
    theirs = {r.name: r for r in second if r.batch_size == batch}
    return [
        Pair(r.name, batch, r.tokens_per_s, theirs[r.name].tokens_per_s)
        for r in first
        if r.batch_size == batch and r.name in theirs
    ]


def verdict(settings: list[Pair], probes: list[Pair]) -> str:
    """The rule of the module docstring."""
    if all(p.within for p in settings):
        return REPRODUCED
    if not probes:
        return NO_PROBES
    faster = statistics.median(p.ratio for p in settings) > 1
    host_moved = any(not p.within and (p.ratio > 1) == faster for p in probes)
    return HOST_CHANGED if host_moved else NOT_REPRODUCED


def setup_differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """The ``SAME_SETUP`` fields two recorded setups disagree on, each as ``field first vs
    second`` (for the models, which family's shape and which of its fields)."""
    differences = []
    for name in SAME_SETUP:
        one, other = first.get(name), second.get(name)
        if one == other:
            continue
        if name == "models" and isinstance(one, dict) and isinstance(other, dict):
            differences += model_differences(one, other)
        else:
            differences.append(f"{name} {one!r} vs {other!r}")
    return differences


def model_differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """How two runs' model shapes differ: the families only one timed, then each shared
    family's differing fields."""
    if set(first) != set(second):
        return [f"models of {sorted(first)} vs {sorted(second)}"]
    lines = []
    for family, shape in first.items():
        theirs = second[family]
        if not isinstance(shape, dict) or not isinstance(theirs, dict):
            lines.append(f"the {family} model {shape!r} vs {theirs!r}")
            continue
        fields = sorted(set(shape) | set(theirs))
        lines += [
            f"the {family} model's {field} {shape.get(field)!r} vs {theirs.get(field)!r}"
            for field in fields
            if shape.get(field) != theirs.get(field)
        ]
    return lines


def tokens_per_sample(record: Record) -> float:
    """The most generated tokens one sample of a round held (every round generates the same
    number when every position is generated)."""
    return max(record.round_tokens, default=0) / record.batch_size


def check_same_measurement(
    first: Throughput, second: Throughput, names: tuple[str, str] = ("first", "second")
) -> None:
    """Refuse two runs that did not measure the same thing (the rules of the module docstring),
    naming ``names`` (the files) and what differs."""
    a, b = names
    if bool(first.setup) != bool(second.setup):
        recorded, missing = (a, b) if first.setup else (b, a)
        raise ConfigError(
            f"{missing} records no setup (measured before the preset, model shapes and sampler "
            f"settings were recorded) while {recorded} does, so they cannot be checked to have "
            f"measured the same models and settings; rerun the throughput stage of {missing}"
        )
    differences = setup_differences(first.setup, second.setup)
    threads = (first.machine.get("torch_threads"), second.machine.get("torch_threads"))
    if threads[0] != threads[1]:
        differences.append(f"torch threads {threads[0]!r} vs {threads[1]!r}")
    theirs = {(r.name, r.batch_size): r for r in second.records}
    for record in first.records:
        other = theirs.get((record.name, record.batch_size))
        if other is not None and tokens_per_sample(record) != tokens_per_sample(other):
            differences.append(
                f"{record.name!r} at batch {record.batch_size} generated "
                f"{tokens_per_sample(record):g} vs {tokens_per_sample(other):g} tokens per sample"
            )
            break
    if differences:
        raise ConfigError(
            f"{a} and {b} measured different things, so their speeds do not compare: "
            + "; ".join(differences)
        )


def compare_runs(
    first: Throughput,
    second: Throughput,
    names: tuple[str, str] = ("the first run", "the second run"),
) -> list[BatchAgreement]:
    """Per batch size measured by both runs (smallest first), the pairs and the verdict. Runs
    that did not measure the same thing (``check_same_measurement``, naming ``names``) or that
    share no setting at any batch size are refused."""
    check_same_measurement(first, second, names)
    batches = sorted({r.batch_size for r in first.records} & {r.batch_size for r in second.records})
    agreements = []
    for batch in batches:
        settings = pairs(first.records, second.records, batch)
        if settings:
            probes = pairs(first.probes, second.probes, batch)
            agreements.append(BatchAgreement(batch, settings, probes, verdict(settings, probes)))
    if not agreements:
        raise ConfigError("the two runs share no setting at any batch size: nothing to compare")
    return agreements


def markdown(agreements: list[BatchAgreement], recorded_setup: bool = True) -> str:
    """One table per batch size (settings, then probes) and its verdict line; runs that record
    no setup first say what could not be checked."""
    lines: list[str] = [] if recorded_setup else [NO_SETUP_NOTE, ""]
    for a in agreements:
        lines += [
            f"### Batch {a.batch_size}: {a.verdict}",
            "",
            "| setting | first run median [min, max] | second run median [min, max] | "
            "second / first | inside each other's spread |",
            "| --- | --- | --- | ---: | --- |",
        ]
        for p in [*a.settings, *a.probes]:
            lines.append(
                f"| {p.name} | {spread_text(p.first)} | {spread_text(p.second)} | "
                f"{p.ratio:.3f} | {'yes' if p.within else 'no'} |"
            )
        ratios = a.ratio_spread()
        lines += [
            "",
            f"Settings inside each other's spread: {a.settings_within} of {len(a.settings)}; "
            f"ratio of medians {ratios.median:.3f} [{ratios.low:.3f}, {ratios.high:.3f}].",
            "",
        ]
    return "\n".join(lines)


def spread_text(s: Spread) -> str:
    return f"{s.median:,.0f} [{s.low:,.0f}, {s.high:,.0f}]"


def load(path: Path) -> Throughput:
    """A measurement as ``Throughput.as_dict`` wrote it, bare or inside a stored stage's
    ``result``; anything else is one line naming the file (and the field)."""
    try:
        text = path.read_text(encoding="utf-8")
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
    )


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


def summary(agreements: list[BatchAgreement]) -> list[dict[str, Any]]:
    return [
        {
            "batch_size": a.batch_size,
            "verdict": a.verdict,
            "settings_within": a.settings_within,
            "settings": len(a.settings),
            "ratio_of_medians": vars(a.ratio_spread()),
            "probe_ratios": {p.name: p.ratio for p in a.probes},
            "probes_within": {p.name: p.within for p in a.probes},
        }
        for a in agreements
    ]


def compare_files(first: Path, second: Path, json_out: Path | None) -> None:
    """The command: both files read and checked, compared, the tables printed and the summary
    written (its path checked before anything is read)."""
    if json_out is not None:
        json_out = writable_file(json_out, "--json")
    runs = load(first), load(second)
    agreements = compare_runs(*runs, names=(str(first), str(second)))
    print(markdown(agreements, recorded_setup=bool(runs[0].setup)))
    if json_out is not None:
        write_atomic(json_out, json.dumps(summary(agreements), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m eval.throughput_runs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    return report_user_errors(lambda: compare_files(args.first, args.second, args.json))


if __name__ == "__main__":
    sys.exit(main())
