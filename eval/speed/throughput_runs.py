"""Two runs of the same throughput measurement compared: did the tokens/s reproduce, and if not,
did the host change speed or did the measurement?

    python -m eval.speed.throughput_runs runs/a/stages/throughput.json runs/b/stages/throughput.json

For every batch size both runs measured:

- each setting's medians and whether each lies inside the other run's [min, max] (the spread
  the report states), and the ratio of medians second / first, with its min, median and max over
  the settings;
- the same for the host probes (``eval.speed.throughput.host_probes``), which measure the machine
  and not a model;
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

**Ratios to the AR.** What the frontier states is each setting's tokens/s over the AR's at T=1
in the same rounds, replicated over fresh processes (``eval.speed.ratios``). For runs that kept
their processes' runs (the main job's, from three processes), every setting's ratio in each run
is given as the geometric mean over its processes with the 95% t-interval of the log ratios, and
whether the second run's lies inside the first run's 95% prediction interval for a rerun's mean
(``RERUN_RULE``: the interval a setting that reproduces lands inside 95% of the time, not the
interval for the first run's own mean). A second verdict: ``ratios reproduced`` when every
setting's second-run ratio lies inside that interval; ``ratios not reproduced`` when one lies
outside its interval at level 1 - 0.05 / N for N settings (Bonferroni: a measurement that
reproduces gets this verdict at most 5% of the time, however its settings co-vary, and they do:
they share the AR's rounds); ``ratios within chance`` between the two (some settings outside
their 95% interval, as N settings reproducing may leave, none outside the family-wise one). Not
compared when the first run has fewer than two processes (no interval) or no AR at T=1 at that
batch size. With 3 processes and 16 settings the family-wise interval is about 4 times as wide as
the 95% one (Student's t at 2 degrees of freedom), so it catches only large moves.

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
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.speed.ratios import REFERENCE, RatioEstimate, process_ratios, ratio_estimate
from eval.speed.throughput import Record, Spread, Throughput
from eval.speed.throughput_files import load
from shared.cli_args import CommandParser, writable_file
from shared.door import write_atomic
from shared.errors import ConfigError, report_user_errors

REPRODUCED = "reproduced"
HOST_CHANGED = "host changed speed"
NOT_REPRODUCED = "not reproduced"
NO_PROBES = "not reproduced (no host probes)"
# The verdict on the ratios to the AR (eval.speed.ratios), given beside the one on tokens/s.
RATIOS_REPRODUCED = "ratios reproduced"
RATIOS_NOT_REPRODUCED = "ratios not reproduced"
RATIOS_WITHIN_CHANCE = "ratios within chance"
NO_RATIO_INTERVAL = "ratios not compared (the first run has no interval: fewer than 2 processes)"
NO_REFERENCE = "ratios not compared (no AR T=1 at this batch size)"
# At least how often a measurement that reproduces escapes "ratios not reproduced" at one batch
# size: each of N settings is judged at level 1 - (1 - RATIOS_LEVEL) / N (Bonferroni).
RATIOS_LEVEL = 0.95
RERUN_RULE = (
    "a rerun's geometric mean ratio over n2 processes is judged against the first run's 95% "
    "prediction interval for it, exp(m1 +- t(0.975, n1 - 1) * s1 * sqrt(1/n1 + 1/n2)) with m1 "
    "and s1 the mean and standard deviation of the first run's n1 log ratios (n1 - 1 degrees of "
    "freedom): a setting that reproduces lands inside 95% of the time, so about 1 in 20 outside "
    "is what reproduction predicts. The verdict: 'ratios reproduced' when every setting lies "
    "inside; 'ratios not reproduced' when one lies outside its interval at 1 - 0.05/N for N "
    "settings (Bonferroni), which a measurement that reproduces gets at most 5% of the time; "
    "'ratios within chance' between the two"
)

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
class RatioPair:
    """One setting's tokens/s over the AR's in the same rounds, in both runs: each the
    geometric mean over that run's processes with its 95% t-interval (``eval.speed.ratios``)."""

    name: str
    first: RatioEstimate
    second: RatioEstimate

    @property
    def rerun_interval(self) -> tuple[float, float] | None:
        """The first run's 95% prediction interval for the second run's mean (``RERUN_RULE``)."""
        return self.first.rerun_interval(self.second.count)

    @property
    def inside(self) -> bool:
        """The second run's ratio lies inside the first run's 95% prediction interval for it."""
        return self.first.holds(self.second.mean, self.second.count)


@dataclass(frozen=True)
class BatchAgreement:
    batch_size: int
    settings: list[Pair]
    probes: list[Pair]
    verdict: str
    ratios: list[RatioPair] = field(default_factory=list)
    ratio_verdict: str = NO_REFERENCE

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


def ratio_pairs(first: Throughput, second: Throughput, batch: int) -> list[RatioPair]:
    """Every setting but the AR reference that both runs measured at ``batch`` with it, as
    ratio estimates over each run's processes ([] when a run lacks the reference)."""
    names = [p.name for p in pairs(first.records, second.records, batch) if p.name != REFERENCE]
    try:
        return [
            RatioPair(
                name,
                ratio_estimate([process_ratios(first, name, batch)]),
                ratio_estimate([process_ratios(second, name, batch)]),
            )
            for name in names
        ]
    except KeyError:
        return []


def ratio_verdict(ratios: list[RatioPair]) -> str:
    """Reproduced when every setting's second ratio lies inside the first run's 95% prediction
    interval, not reproduced when one lies outside it at 1 - (1 - RATIOS_LEVEL) / N for N
    settings, within chance between (``RERUN_RULE``)."""
    if not ratios:
        return NO_REFERENCE
    if any(pair.first.rerun_interval(pair.second.count) is None for pair in ratios):
        return NO_RATIO_INTERVAL
    if all(p.inside for p in ratios):
        return RATIOS_REPRODUCED
    level = 1 - (1 - RATIOS_LEVEL) / len(ratios)
    if all(p.first.holds(p.second.mean, p.second.count, level) for p in ratios):
        return RATIOS_WITHIN_CHANCE
    return RATIOS_NOT_REPRODUCED


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
            ratios = ratio_pairs(first, second, batch)
            agreements.append(
                BatchAgreement(
                    batch, settings, probes, verdict(settings, probes), ratios,
                    ratio_verdict(ratios),
                )
            )  # fmt: skip
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
        lines += ratio_markdown(a)
    return "\n".join(lines)


def ratio_markdown(agreement: BatchAgreement) -> list[str]:
    """The ratios to the AR in both runs, whether each rerun's lies inside the first's interval,
    and the verdict on them."""
    lines = [f"Ratios to the AR ({REFERENCE}) in the same rounds: {agreement.ratio_verdict}.", ""]
    if not agreement.ratios:
        return lines
    lines += [
        "| setting | first run ratio [95%] | second run ratio [95%] | first's 95% interval for "
        "a rerun | second inside it |",
        "| --- | --- | --- | --- | --- |",
    ]
    for pair in agreement.ratios:
        lines.append(
            f"| {pair.name} | {ratio_text(pair.first)} | {ratio_text(pair.second)} | "
            f"{interval_text(pair.rerun_interval)} | {'yes' if pair.inside else 'no'} |"
        )
    inside = sum(pair.inside for pair in agreement.ratios)
    lines += ["", f"Second-run ratios inside the first's 95% interval for a rerun: {inside} of "
              f"{len(agreement.ratios)}. The rule: {RERUN_RULE}.", ""]  # fmt: skip
    return lines


def interval_text(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def ratio_text(estimate: RatioEstimate) -> str:
    if estimate.interval is None:
        return f"{estimate.mean:.3f} (1 process)"
    return f"{estimate.mean:.3f} [{estimate.interval[0]:.3f}, {estimate.interval[1]:.3f}]"


def spread_text(s: Spread) -> str:
    return f"{s.median:,.0f} [{s.low:,.0f}, {s.high:,.0f}]"


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
            "ratio_verdict": a.ratio_verdict,
            "ratios": {
                p.name: {
                    "first": vars(p.first),
                    "second": vars(p.second),
                    "rerun_interval": p.rerun_interval,
                    "inside": p.inside,
                }
                for p in a.ratios
            },
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
        prog="python -m eval.speed.throughput_runs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    return report_user_errors(lambda: compare_files(args.first, args.second, args.json))


if __name__ == "__main__":
    sys.exit(main())
