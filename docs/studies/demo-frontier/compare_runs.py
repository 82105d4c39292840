"""Two throughput measurements of the same settings compared: whether each median lies inside the
other run's [min, max], and the ratio of the medians per batch size.

    python docs/studies/demo-frontier/compare_runs.py throughput-run-a.json throughput-run-b.json
"""

import json
import statistics
import sys


def medians_and_spreads(path: str) -> dict[tuple[str, int], dict[str, float]]:
    data = json.load(open(path))
    data = data.get("result", data)  # a stored stage wraps the measurement
    return {(r["name"], r["batch_size"]): r["tokens_per_s"] for r in data["records"]}


def main(first: str, second: str) -> None:
    a, b = medians_and_spreads(first), medians_and_spreads(second)
    inside, ratios = 0, {}
    for key, x in a.items():
        y = b[key]
        both = y["low"] <= x["median"] <= y["high"] and x["low"] <= y["median"] <= x["high"]
        inside += both
        ratios.setdefault(key[1], []).append(y["median"] / x["median"])
        verdict = "within" if both else "OUT"
        print(
            key, round(x["median"]), round(y["median"]), f"{y['median'] / x['median']:.3f}", verdict
        )
    print(f"each median within the other run's [min, max]: {inside} / {len(a)}")
    for batch, values in ratios.items():
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"batch {batch}: ratio of medians {mid:.3f} [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
