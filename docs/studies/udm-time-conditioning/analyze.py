"""Read the six runs of run.sh and apply the rule of README.md: writes report.json beside this file.

python docs/studies/udm-time-conditioning/analyze.py RUNS_FOLDER
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from eval.budgets import seed_spread  # noqa: E402
from eval.curves import unigram_entropy  # noqa: E402
from eval.experiments.stages import load, validation_rows  # noqa: E402
from shared.hardware import cpu_name  # noqa: E402

SEEDS = (0, 1, 2)
# run.sh ran the first two runs from the working tree, the rest from a worktree pinned at b13f533
RUNS_CODE = (
    "b13f533 (udm-tctrue-s0 at 109cd9a, which differs from it only in shared/hardware.py's MFU "
    "peak and in docs)"
)


def main(runs: Path) -> None:
    final = {
        (conditioned, seed): json.loads(
            (runs / f"udm-tc{conditioned}-s{seed}/final.json").read_text()
        )
        for conditioned in ("false", "true")
        for seed in SEEDS
    }
    _, tokenizer, state = load(runs, "udm-tcfalse-s0")
    floor = unigram_entropy(validation_rows(state, tokenizer), tokenizer.pad_id)
    nelbo = {key: record["val_nats_per_token"] for key, record in final.items()}
    learned = all(value < floor for value in nelbo.values())
    differences = np.array([nelbo["true", s] - nelbo["false", s] for s in SEEDS])
    spread = seed_spread(differences.tolist())
    mean, low, high = spread.mean, spread.low, spread.high
    if not learned:
        verdict = "inconclusive: a run did not end below the unigram entropy"
    elif high < 0:
        verdict = "time conditioning helps: it becomes the default"
    elif low > 0:
        verdict = "time conditioning hurts: it stays off"
    else:
        verdict = "not resolved: the interval contains 0, time conditioning stays off"
    report = {
        "unigram_entropy": floor,
        "val_nelbo": {f"time={c} seed={s}": nelbo[c, s] for c, s in nelbo},
        "differences_with_minus_without": differences.tolist(),
        "mean_difference": mean,
        "interval_95": [low, high],
        "learned": learned,
        "verdict": verdict,
        "runs_code": RUNS_CODE,
        "commit_of_analysis": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip(),
        "machine": cpu_name(),
    }
    (HERE / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
