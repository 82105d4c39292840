"""Measure README.md's two questions on the udm teachers (and their distilled students) and apply
its rules: writes report.json beside this file.

    python docs/studies/udm-sampling/measure.py WORK --teachers T0 T1 T2 --students S0 S1 S2

T_i / S_i: seed i's teacher run folder and its student (``duolm distill T_i S_i
--steps-per-round 64``). Each seed's judged sample sets are kept in WORK/seed-i.json, so a rerun
after an interruption judges only what is missing.
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from dllm.generator import DiffusionGenerator  # noqa: E402
from dllm.uniform.sampler import UniformSamplerConfig  # noqa: E402
from eval.budgets import seed_spread  # noqa: E402
from eval.curves import unigram_entropy  # noqa: E402
from eval.experiments.stages import validation_rows  # noqa: E402
from eval.quality import diversity_report, load_judge  # noqa: E402
from shared.checkpoint import load_model_from_checkpoint  # noqa: E402
from shared.hardware import cpu_name  # noqa: E402

SAMPLES, LENGTH = 54, 64
DISTILL_STEPS = (4, 8, 16, 64)
CORRECTOR_STEPS = (8, 16, 64)
KAPPAS = (0.5, 0.9)
ENTROPY_SHARE = 0.95  # a lower perplexity with less than 95% of the other's entropy is not counted
PLATEAU_MARGIN = 0.1


def sample_settings(has_student: bool) -> dict[str, tuple[str, UniformSamplerConfig]]:
    """Every judged set of one seed: name -> (model role, sampler)."""
    settings = {}
    for steps in DISTILL_STEPS:
        for role in ("teacher", "student") if has_student else ("teacher",):
            settings[f"{role} greedy-tail {steps}"] = (role, UniformSamplerConfig(steps, True))
    for steps in CORRECTOR_STEPS:
        settings[f"teacher ancestral {steps}"] = ("teacher", UniformSamplerConfig(steps))
        for kappa in KAPPAS:
            config = UniformSamplerConfig(steps, corrector=kappa)
            settings[f"teacher kappa {kappa:g} {steps}"] = ("teacher", config)
    return settings


def judged_set(engine: DiffusionGenerator, config: UniformSamplerConfig, judge, shape) -> dict:
    samples, length = shape
    canvas = engine.prompt_canvas([[]] * samples, length)
    result = engine.fill(canvas, config, seed=0, eos="stop")
    texts = [text if text.strip() else " " for text in result.texts]
    per_sample = judge.score(texts).per_sample_nats_per_token
    return {
        "log_ppl": statistics.fmean(v for v in per_sample if not math.isnan(v)),
        "per_sample_nats": per_sample,
        "mean_length": statistics.fmean(len(ids) for ids in result.tokens),
        "nfe": result.nfe,
        **diversity_report(texts, result.tokens),
        "example": texts[0][:200],
    }


def measure_seed(path: Path, teacher: Path, student: Path | None, judge, shape) -> dict:
    done = json.loads(path.read_text()) if path.exists() else {}
    engines = {"teacher": DiffusionGenerator(*load_model_from_checkpoint(teacher))}
    if student is not None:
        engines["student"] = DiffusionGenerator(*load_model_from_checkpoint(student))
    for name, (role, config) in sample_settings(student is not None).items():
        if name not in done:
            done[name] = judged_set(engines[role], config, judge, shape)
            path.write_text(json.dumps(done, indent=1))
            print(f"{path.stem} {name}: judge ppl {math.exp(done[name]['log_ppl']):.1f}")
    return done


def compare(per_seed: list[dict], lower: str, base: str) -> dict:
    """``lower`` against ``base``, paired by seed: the mean log-ppl difference, its interval and
    the rule's reading."""
    differences = [seed[lower]["log_ppl"] - seed[base]["log_ppl"] for seed in per_seed]
    spread = seed_spread(differences)
    entropy = [
        statistics.fmean(seed[name]["unigram_entropy"] for seed in per_seed)
        for name in (lower, base)
    ]
    if spread.high < 0:
        reading = "lower" if entropy[0] >= ENTROPY_SHARE * entropy[1] else "bought with repetition"
    elif spread.low > 0:
        reading = "higher"
    else:
        reading = "not resolved"
    return {
        "differences": differences,
        "mean": spread.mean,
        "interval_95": [spread.low, spread.high],
        "entropy": entropy,
        "reading": reading,
    }


def rules_applied(per_seed: list[dict], learned: bool) -> dict:
    distill = {
        steps: compare(per_seed, f"student greedy-tail {steps}", f"teacher greedy-tail {steps}")
        for steps in DISTILL_STEPS
        if f"student greedy-tail {steps}" in per_seed[0]
    }
    corrector = {
        f"{kappa:g}": {
            steps: compare(
                per_seed, f"teacher kappa {kappa:g} {steps}", f"teacher ancestral {steps}"
            )
            for steps in CORRECTOR_STEPS
        }
        for kappa in KAPPAS
    }
    winners = [
        k
        for k, by_steps in corrector.items()
        if all(c["reading"] == "lower" for c in by_steps.values())
    ]
    winners.sort(key=lambda k: corrector[k][16]["mean"])
    default = (
        "inconclusive: a teacher did not learn"
        if not learned
        else (
            f"kappa {winners[0]} becomes the default" if winners else "ancestral stays the default"
        )
    )
    return {"distillation": distill, "corrector": corrector, "corrector_verdict": default}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--teachers", type=Path, nargs=3, required=True)
    parser.add_argument("--students", type=Path, nargs=3)
    parser.add_argument(
        "--samples", type=int, default=SAMPLES, help="the rule's 54; fewer: a dry run"
    )
    parser.add_argument("--length", type=int, default=LENGTH, help="the rule's 64; else a dry run")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    judge = load_judge("smollm2")
    students = args.students or [None] * 3
    per_seed = [
        measure_seed(
            args.work / f"seed-{i}.json", teacher, student, judge, (args.samples, args.length)
        )
        for i, (teacher, student) in enumerate(zip(args.teachers, students))
    ]
    _, tokenizer, state = load_model_from_checkpoint(args.teachers[0])
    floor = unigram_entropy(validation_rows(state, tokenizer), tokenizer.pad_id)
    finals = [
        json.loads((t / "final.json").read_text())["val_nats_per_token"] for t in args.teachers
    ]
    learned = all(v < floor - PLATEAU_MARGIN for v in finals)
    sets = {
        name: {
            "judge_ppl_per_seed": [math.exp(seed[name]["log_ppl"]) for seed in per_seed],
            "entropy": statistics.fmean(seed[name]["unigram_entropy"] for seed in per_seed),
            "mean_length": statistics.fmean(seed[name]["mean_length"] for seed in per_seed),
            "repetition_rate_4gram": statistics.fmean(
                seed[name]["repetition_rate_4gram"] for seed in per_seed
            ),
            "nfe": per_seed[0][name]["nfe"],
        }
        for name in per_seed[0]
    }
    report = {
        "teachers": [str(t) for t in args.teachers],
        "teacher_final_nelbo": finals,
        "unigram_entropy": floor,
        "learned": learned,
        "judge": judge.identity,
        "sets": sets,
        **rules_applied(per_seed, learned),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip(),
        "machine": cpu_name(),
    }
    report["samples"], report["length"] = args.samples, args.length
    dry = (args.samples, args.length) != (SAMPLES, LENGTH)
    (args.work / "report.json" if dry else HERE / "report.json").write_text(
        json.dumps(report, indent=2) + "\n"
    )
    print(json.dumps({k: report[k] for k in ("learned", "corrector_verdict")}, indent=2))


if __name__ == "__main__":
    main()
