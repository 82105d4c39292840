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
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.throughput import Record, Spread, Throughput
from shared.received import read_json_file

REPRODUCED = "reproduced"
HOST_CHANGED = "host changed speed"
NOT_REPRODUCED = "not reproduced"
NO_PROBES = "not reproduced (no host probes)"


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


def compare_runs(first: Throughput, second: Throughput) -> list[BatchAgreement]:
    """Per batch size measured by both runs (smallest first), the pairs and the verdict. Runs
    that share no setting at any batch size are refused."""
    batches = sorted({r.batch_size for r in first.records} & {r.batch_size for r in second.records})
    agreements = []
    for batch in batches:
        settings = pairs(first.records, second.records, batch)
        if settings:
            probes = pairs(first.probes, second.probes, batch)
            agreements.append(BatchAgreement(batch, settings, probes, verdict(settings, probes)))
    if not agreements:
        raise ValueError("the two runs share no setting at any batch size: nothing to compare")
    return agreements


def markdown(agreements: list[BatchAgreement]) -> str:
    """One table per batch size (settings, then probes) and its verdict line."""
    lines: list[str] = []
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
    ``result``."""
    try:
        data: dict[str, Any] = read_json_file(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{path}: cannot read a throughput measurement ({error})") from None
    data = data.get("result", data)
    if "records" not in data:
        raise SystemExit(f"{path}: no 'records' in it; give a throughput stage's JSON")
    return Throughput.from_dict(data)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    try:
        agreements = compare_runs(load(args.first), load(args.second))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    print(markdown(agreements))
    if args.json:
        args.json.write_text(json.dumps(summary(agreements), indent=2) + "\n")


if __name__ == "__main__":
    main()
