"""The tables of this study from its measurements (run-*.json, each the main job's throughput
stage as stored in runs/demo/stages/throughput.json):

    python docs/studies/throughput-repeats/summarize.py > docs/studies/throughput-repeats/summary.md
"""

from pathlib import Path

from eval.speed.throughput import PROBE_DISPATCH, PROBE_MATMUL
from eval.speed.throughput_runs import compare_runs, load

HERE = Path(__file__).parent
# How each run was made: the code, and where its measurement ran.
RUNS = {
    "a": "b566b4d, whole job; measured in the job's process",
    "b": "b566b4d, the stage alone rerun; a fresh process",
    "c": "b566b4d, the stage alone rerun; a fresh process",
    "d": "b566b4d, whole job from scratch; measured in the job's process",
    "e": "b566b4d, the stage alone rerun; a fresh process",
    "f": "one spawned process, whole job from scratch",
    "g": "one spawned process, the stage alone rerun",
    "h": "two spawned processes pooled (the default), whole job from scratch",
    "i": "two spawned processes pooled (the default), the stage alone rerun",
    "j": "two spawned processes pooled (the default), the stage alone rerun",
    "k": "two spawned processes pooled (the default), the stage alone rerun",
}
PAIRS = [
    ("a", "b"),
    ("b", "c"),
    ("c", "d"),
    ("d", "e"),
    ("b", "e"),
    ("c", "e"),
    ("e", "f"),
    ("f", "g"),
    ("e", "g"),
    ("g", "h"),
    ("h", "i"),
    ("i", "j"),
    ("j", "k"),
    ("h", "j"),
    ("h", "k"),
]


def main() -> None:
    runs = {
        name: load(HERE / f"run-{name}.json")
        for name in RUNS
        if (HERE / f"run-{name}.json").exists()
    }
    print(
        "| run | how | rounds | matmul probe b1 | dispatch probe b1 "
        "| matmul probe b32 | dispatch probe b32 |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, run in runs.items():
        probe = {(p.name, p.batch_size): p.tokens_per_s.median for p in run.probes}
        print(
            f"| {name} | {RUNS[name]} | {run.records[0].rounds} | "
            + " | ".join(
                f"{probe[(kind, batch)]:,.0f}"
                for batch in (1, 32)
                for kind in (PROBE_MATMUL, PROBE_DISPATCH)
            )
            + " |"
        )
    print()
    print(
        "| pair | batch | settings inside each other's spread "
        "| ratio of medians, median [min, max] | matmul probe ratio | dispatch probe ratio "
        "| verdict |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | --- |")
    for first, second in PAIRS:
        if first not in runs or second not in runs:
            continue
        for batch in compare_runs(runs[first], runs[second]):
            ratio = batch.ratio_spread()
            probes = {p.name: p.ratio for p in batch.probes}
            print(
                f"| {first} -> {second} | {batch.batch_size} | "
                f"{batch.settings_within} of {len(batch.settings)} | "
                f"{ratio.median:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] | "
                f"{probes[PROBE_MATMUL]:.3f} | {probes[PROBE_DISPATCH]:.3f} | {batch.verdict} |"
            )


if __name__ == "__main__":
    main()
