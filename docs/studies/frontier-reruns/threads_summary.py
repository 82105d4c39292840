"""The table of threads.py's runs: per thread count and MDM setting at batch 32, each fresh
process's ratio to the AR at T=1 (the geometric mean over its rounds) and the standard deviation
of the log ratio between processes and between rounds; then each process's median tokens/s.

    python docs/studies/frontier-reruns/threads_summary.py
"""

import json
import math
import statistics
from pathlib import Path

from eval.speed.ratios import round_ratios
from eval.speed.throughput import Throughput

SETTINGS = ("mdm ancestral 8 steps", "mdm ancestral 64 steps")


def main() -> None:
    runs = json.loads((Path(__file__).parent / "threads.json").read_text())
    print("| threads | setting | process ratios | sd(log), processes | sd(log), rounds |")
    print("| ---: | --- | --- | ---: | ---: |")
    for threads in (2, 1):
        measured = [Throughput.from_dict(r["result"]) for r in runs if r["threads"] == threads]
        for name in SETTINGS:
            logs = [[math.log(x) for x in round_ratios(t, name, 32)] for t in measured]
            means = [statistics.fmean(rounds) for rounds in logs]
            ratios = ", ".join(f"{math.exp(m):.3f}" for m in means)
            every = [x for rounds in logs for x in rounds]
            print(
                f"| {threads} | {name} | {ratios} | {statistics.stdev(means):.3f} | "
                f"{statistics.stdev(every):.3f} |"
            )
    print()
    print("| threads | AR T=1 tokens/s | ancestral 64 steps tokens/s | steal (jiffies) |")
    print("| ---: | ---: | ---: | ---: |")
    for r in runs:
        t = Throughput.from_dict(r["result"])
        ar = t.record("ar T=1", 32).tokens_per_s.median
        slow = t.record("mdm ancestral 64 steps", 32).tokens_per_s.median
        print(f"| {r['threads']} | {ar:,.0f} | {slow:,.0f} | {r['steal']} |")


if __name__ == "__main__":
    main()
