"""The tables of docs/studies/frontier-reruns/README.md, from the files run.sh saved:
run-K.json (each run's throughput stage), frontier-K.json (its report's frontier section) and
compare-1-K.json (``eval.speed.throughput_runs`` of run 1 against run K, remade from run-K.json
by rejudge.sh). Ratios are geometric means over processes; a rerun is judged against run 1's 95%
prediction interval for its mean (``eval.speed.ratios``).

    python docs/studies/frontier-reruns/summarize.py > docs/studies/frontier-reruns/summary.md
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from eval.speed.ratios import REFERENCE, RERUN_LEVEL, process_ratios, ratio_estimate  # noqa: E402
from eval.speed.throughput_files import load  # noqa: E402

HERE = Path(__file__).parent


def runs() -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in HERE.glob("run-*.json"))


def headline_table(numbers: list[int]) -> list[str]:
    lines = [
        "| run | created | batch 1 headline | batch 32 headline |",
        "| --- | --- | --- | --- |",
    ]
    for k in numbers:
        frontier = json.loads((HERE / f"frontier-{k}.json").read_text())
        cells = [short(frontier[f"batch {b}"]) for b in (1, 32)]
        created = frontier["provenance"]["created"][11:19]
        lines.append(f"| {k} | {created} | {cells[0]} | {cells[1]} |")
    return lines


def short(section: dict) -> str:
    """The setting a headline names, or that none qualifies."""
    named = section["per_seed"]["headline_setting"]
    return f"{named}" if named else "none qualifies"


def ratio_table(numbers: list[int], batch: int) -> list[str]:
    """Per setting: run 1's ratio [95% over its processes], its 95% interval for a rerun's mean
    (``RatioEstimate.rerun_interval``) and that interval's half-width, each rerun's ratio (*
    outside that interval), and the max/min of the runs' ratios; then the count outside, and
    the count outside run 1's interval for its own mean (the rule these runs were first judged
    by)."""
    measured = {k: load(HERE / f"run-{k}.json") for k in numbers}
    first = measured[numbers[0]]
    names = [r.name for r in first.records if r.batch_size == batch and r.name != REFERENCE]
    lines = [
        "| setting | run 1 ratio [95%] | run 1's interval for a rerun | half-width | "
        + " | ".join(f"run {k}" for k in numbers[1:])
        + " | max / min over runs |",
        "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in numbers[1:]) + " | ---: |",
    ]
    outside = outside_own = 0
    for name in names:
        estimates = {
            k: ratio_estimate([process_ratios(run, name, batch)]) for k, run in measured.items()
        }
        base = estimates[numbers[0]]
        low, high = base.interval
        counts = {estimates[k].count for k in numbers[1:]}
        (rerun_count,) = counts  # every rerun measured with as many processes
        rerun_low, rerun_high = base.rerun_interval(rerun_count)
        cells = []
        for k in numbers[1:]:
            mean = estimates[k].mean
            inside = base.holds(mean, estimates[k].count)
            outside += not inside
            outside_own += not low <= mean <= high
            cells.append(f"{mean:.3f}{'' if inside else ' *'}")
        means = [e.mean for e in estimates.values()]
        lines.append(
            f"| {name} | {base.mean:.3f} [{low:.3f}, {high:.3f}] | "
            f"[{rerun_low:.3f}, {rerun_high:.3f}] | {math.sqrt(rerun_high / rerun_low) - 1:.1%} | "
            + " | ".join(cells)
            + f" | {max(means) / min(means):.3f} |"
        )
    total = len(names) * (len(numbers) - 1)
    lines += [
        "",
        f"Rerun ratios outside run 1's {RERUN_LEVEL:.0%} interval for a rerun (*): {outside} of "
        f"{total} (a setting that reproduces lands outside {1 - RERUN_LEVEL:.0%} of the time: "
        f"{(1 - RERUN_LEVEL) * total:.1f} of {total} expected). Outside run 1's interval for "
        f"its own mean (the rule first used): {outside_own} of {total}.",
    ]
    return lines


def drift_table(numbers: list[int]) -> list[str]:
    """The same pairs on absolute tokens/s (eval.speed.throughput_runs' first verdict) and
    probes."""
    lines = [
        "| pair | batch | tokens/s verdict | settings inside | ratio of medians, median "
        "[min, max] | matmul probe | dispatch probe | ratio verdict |",
        "| --- | ---: | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for k in numbers[1:]:
        for entry in json.loads((HERE / f"compare-1-{k}.json").read_text()):
            spread = entry["ratio_of_medians"]
            probes = entry["probe_ratios"]
            lines.append(
                f"| 1 -> {k} | {entry['batch_size']} | {entry['verdict']} | "
                f"{entry['settings_within']} of {entry['settings']} | {spread['median']:.3f} "
                f"[{spread['low']:.3f}, {spread['high']:.3f}] | "
                f"{probes.get('host probe: matmul', float('nan')):.3f} | "
                f"{probes.get('host probe: dispatch', float('nan')):.3f} | "
                f"{entry['ratio_verdict']} |"
            )
    return lines


def process_spread(numbers: list[int], batch: int) -> list[str]:
    """How far one run's processes are apart: per run, the median over settings of each
    setting's max/min over its processes, for the ratios and for absolute tokens/s."""
    lines = [
        "| run | batch | ratio: max/min over processes (median over settings) | "
        "tokens/s: the same |",
        "| --- | ---: | ---: | ---: |",
    ]
    for k in numbers:
        run = load(HERE / f"run-{k}.json")
        names = [r.name for r in run.records if r.batch_size == batch and r.name != REFERENCE]
        ratio_spreads, speed_spreads = [], []
        for name in names:
            ratios = process_ratios(run, name, batch)
            ratio_spreads.append(max(ratios) / min(ratios))
            medians = [p.record(name, batch).tokens_per_s.median for p in run.processes]
            speed_spreads.append(max(medians) / min(medians))
        lines.append(
            f"| {k} | {batch} | {statistics.median(ratio_spreads):.3f} | "
            f"{statistics.median(speed_spreads):.3f} |"
        )
    return lines


def main() -> None:
    numbers = runs()
    parts = ["# Frontier reruns: tables", "", "## Headlines", "", *headline_table(numbers)]
    for batch in (1, 32):
        parts += ["", f"## Ratios to the AR at batch {batch}", "", *ratio_table(numbers, batch)]
    parts += ["", "## Tokens/s and probes, run 1 against each rerun", "", *drift_table(numbers)]
    parts += ["", "## Spread between one run's processes", ""]
    for batch in (1, 32):
        parts += process_spread(numbers, batch) + [""]
    print("\n".join(parts).rstrip())


if __name__ == "__main__":
    main()
