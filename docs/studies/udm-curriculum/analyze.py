"""Apply the rule of README.md to the curriculum runs and the plain runs: writes report.json.

    python docs/studies/udm-curriculum/analyze.py CURRICULUM_RUNS PLAIN_RUNS

CURRICULUM_RUNS holds cur-s{0,1,2} and plain-s0 (the plain run made again at this study's
commit); PLAIN_RUNS holds the time-conditioning study's udm-tcfalse-s{0,1,2}.
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


def nelbo(run: Path) -> float:
    return json.loads((run / "final.json").read_text())["val_nats_per_token"]


def verdict_of(learned: bool, low: float, high: float) -> str:
    if not learned:
        return "inconclusive: a run did not end below the unigram entropy"
    if high < 0:
        return "the curriculum helps: it becomes the default"
    if low > 0:
        return "the curriculum hurts: it stays off"
    return "not resolved: the interval contains 0, the curriculum stays off"


def main(curriculum_runs: Path, plain_runs: Path) -> None:
    plain = {s: nelbo(plain_runs / f"udm-tcfalse-s{s}") for s in SEEDS}
    remade = nelbo(curriculum_runs / "plain-s0")
    if abs(remade - plain[0]) > 1e-6:
        raise SystemExit(f"the plain run made again gives {remade}, not {plain[0]}: rule not met")
    curriculum = {s: nelbo(curriculum_runs / f"cur-s{s}") for s in SEEDS}
    _, tokenizer, state = load(plain_runs, "udm-tcfalse-s0")
    floor = unigram_entropy(validation_rows(state, tokenizer), tokenizer.pad_id)
    learned = all(v < floor for v in [*plain.values(), *curriculum.values()])
    differences = np.array([curriculum[s] - plain[s] for s in SEEDS])
    spread = seed_spread(differences.tolist())
    mean, low, high = spread.mean, spread.low, spread.high
    report = {
        "unigram_entropy": floor,
        "plain": plain,
        "plain_seed0_remade": remade,
        "curriculum": curriculum,
        "differences_curriculum_minus_plain": differences.tolist(),
        "mean_difference": mean,
        "interval_95": [low, high],
        "learned": learned,
        "verdict": verdict_of(learned, low, high),
        "commit_of_analysis": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip(),
        "machine": cpu_name(),
    }
    (HERE / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
