"""The exact frontier: how far each family's samples are from the truth, split into the sampler's
own error and the model's, against the measured speed of the same setting.

    python -m eval.experiments.exact_frontier --out runs/exact-frontier --scale cpu
    python -m eval.experiments.exact_frontier --out runs/exact-frontier-smoke --scale smoke

AR, MDM, BD and UDM are trained on one tiny hidden Markov language at one budget (same preset,
steps, batch and seed; ``eval.experiments.exact_frontier_setup``), once per training seed. For
every sampler setting the output distribution q is computed exactly
(``eval.synthetic.exact.frontier``) twice: with the exact denoiser (the sampler's error) and with
the trained network (the total error); the difference is the model's share. Speed is measured
on the trained networks (``eval.speed.throughput.measure``) as a ratio to the AR in the same
rounds. The report and its headline are written by ``eval.experiments.exact_frontier_report``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arlm.generate import ARGenerator
from dllm.generator import DiffusionGenerator
from eval.experiments.exact_frontier_report import write_report
from eval.experiments.exact_frontier_setup import (
    BLOCK_SIZE,
    FAMILIES,
    GEN_LENGTH,
    MIN_PROB,
    POSITIVE_CONTROL_TOLERANCE,
    SEQ_LEN,
    SamplerSetting,
    Scale,
    check_scale,
    is_positive_control,
    language,
    language_spec,
    sampler_settings,
    symbol_tokenizer,
)
from eval.experiments.stages import (
    Stages,
    check_equal_budgets,
    load,
    locked_job,
    run_stoppable,
    train_or_reuse,
)
from eval.speed.ratios import process_ratios
from eval.speed.throughput import Setting, measure
from eval.synthetic.exact.denoisers import exact_denoiser
from eval.synthetic.exact.frontier import sampler_error
from eval.synthetic.likelihood import language_rows, model_estimate
from shared.cli_args import CommandParser
from shared.data.synthetic.hmm import HMMLanguage
from shared.faults import StopRequest
from shared.hardware import cpu_name
from shared.objective import objective_for_run
from shared.tokenizer import Tokenizer


class PositiveControlFailed(RuntimeError):
    """A setting that is exact with the exact denoiser gave a nonzero divergence."""


def training_overrides(scale: Scale, seed: int, tokenizer: str, family: str) -> dict[str, Any]:
    """One budget for every family; only what the objective itself requires differs (the
    uniform-state objective trains on packed rows, block diffusion has its block size)."""
    shared = dict(
        dataset=language_spec(scale.corpus),
        tokenizer=tokenizer,
        seq_len=SEQ_LEN,
        max_seq_len=SEQ_LEN,
        max_steps=scale.max_steps,
        batch_size=scale.batch_size,
        eval_every=scale.max_steps,
        lr=5e-3,
        seed=seed,
        protocol="packed" if family == "udm" else "padded",
    )
    return shared | ({"block_size": BLOCK_SIZE} if family == "bd" else {})


def train_seed(out: Path, scale: Scale, seed: int, tokenizer: str, force: bool) -> dict:
    summaries = {
        family: train_or_reuse(
            f"{family} seed {seed}",
            out / f"seed{seed}" / family,
            "tiny",
            {"objective": family},
            training_overrides(scale, seed, tokenizer, family),
            force,
        )
        for family in FAMILIES
    }
    check_equal_budgets(summaries, "tokens")
    return summaries


def divergence(family, model, lang, tokenizer, setting: SamplerSetting, state, min_prob):
    result = sampler_error(
        family,
        model,
        lang,
        tokenizer,
        setting.config(),
        GEN_LENGTH,
        state=state,
        min_prob=min_prob,
    )
    return {key: float(value) for key, value in result.items()}


def sampler_errors(
    lang: HMMLanguage, tokenizer: Tokenizer, every: bool
) -> dict[str, dict[str, float]]:
    """Every setting's error with the exact denoiser (no training involved)."""
    state = {"train_config": {"block_size": BLOCK_SIZE, "schedule": "linear"}}
    errors = {}
    for setting in sampler_settings(every):
        model = exact_denoiser(setting.family, lang, tokenizer, GEN_LENGTH + 1)
        errors[setting.name] = divergence(
            setting.family, model, lang, tokenizer, setting, state, 0.0
        )
    return errors


def check_positive_controls(errors: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """AR and one-token-per-step random order must be exact; raise if any is not."""
    checks = []
    for setting in filter(is_positive_control, sampler_settings()):
        if setting.name not in errors:
            raise PositiveControlFailed(f"positive control {setting.name} was not computed")
        worst = max(abs(errors[setting.name][k]) for k in ("kl_qp", "kl_pq", "tv"))
        checks.append({"setting": setting.name, "max_divergence": worst})
        if not worst <= POSITIVE_CONTROL_TOLERANCE:
            raise PositiveControlFailed(
                f"positive control failed: {setting.name} with the exact denoiser is "
                f"{worst:.3g} from the language (must be <= {POSITIVE_CONTROL_TOLERANCE})"
            )
    return checks


def total_errors(run_root: Path, lang: HMMLanguage, every: bool) -> dict[str, dict[str, float]]:
    """Every setting's error with the trained network of its family."""
    loaded = {family: load(run_root, family) for family in FAMILIES}
    errors = {}
    for setting in sampler_settings(every):
        model, tokenizer, state = loaded[setting.family]
        model.eval()
        errors[setting.name] = divergence(
            setting.family, model, lang, tokenizer, setting, state, MIN_PROB
        )
    return errors


def likelihood_gaps(run_root: Path, lang: HMMLanguage, nelbo_samples: int) -> dict[str, Any]:
    """Exact AR NLL and the MDM's Monte-Carlo NELBO per token over the whole support, weighted
    by p, minus the language's entropy rate (bd and udm: not computed here)."""
    strings, log_p = zip(*lang.enumerate())
    p = np.exp(np.asarray(log_p))
    tokens = np.array([len(s) + 1 for s in strings], dtype=np.float64)
    entropy = lang.entropy().nats_per_token
    gaps = {}
    for family in ("ar", "mdm"):
        model, tokenizer, state = load(run_root, family)
        model.eval()
        objective = objective_for_run(state["objective"], state["train_config"], tokenizer)
        rows = language_rows(strings, tokenizer, SEQ_LEN, lang)
        estimate = model_estimate(model, objective, rows, tokenizer, nelbo_samples=nelbo_samples)
        per_token = float(p @ np.asarray(estimate.row_nats) / (p @ tokens))
        gaps[family] = {
            "kind": estimate.kind,
            "nats_per_token": per_token,
            "gap": per_token - entropy,
        }
    return {"entropy_nats_per_token": entropy, "families": gaps}


def sample_runner(family: str, model, tokenizer: Tokenizer, state, setting, batch: int):
    """A zero-argument batch of real samples; returns the tokens of the samples with their EOS."""
    config = setting.config()
    if family == "ar":
        engine = ARGenerator(model, tokenizer)

        def run_ar() -> int:
            result = engine.generate([[tokenizer.eos_id]] * batch, config, seed=0)
            return sum(len(row) for row in result.tokens)

        return run_ar
    engine = DiffusionGenerator(model, tokenizer, state)
    options = {"kv_cache": False} if family == "bd" else {}

    def run_diffusion() -> int:
        result = engine.generate([[]] * batch, GEN_LENGTH, config, seed=0, **options)
        return sum(min(len(row) + 1, GEN_LENGTH) for row in result.tokens)

    return run_diffusion


def speed_ratios(run_root: Path, scale: Scale) -> dict[str, float]:
    """Each setting's tokens/s over the AR's in the same rounds (median over rounds)."""
    loaded = {family: load(run_root, family) for family in FAMILIES}
    timed = []
    for setting in sampler_settings(scale.every_setting):
        model, tokenizer, state = loaded[setting.family]
        model.eval()
        run = sample_runner(setting.family, model, tokenizer, state, setting, scale.speed_batch)
        timed.append(Setting(setting.name, scale.speed_batch, run))
    with torch.no_grad():
        result = measure(timed, rounds=scale.speed_rounds, warmup=1)
    reference = sampler_settings()[0].name
    return {
        s.name: process_ratios(result, s.name, scale.speed_batch, reference)[0] for s in timed
    } | {"_ar_tokens_per_s": result.record(reference, scale.speed_batch).tokens_per_s.median}


def measure_seed(out: Path, seed: int, scale: Scale, summaries: dict, stages: Stages) -> dict:
    lang, run_root = language(), out / f"seed{seed}"
    key = {"seed": seed, "steps": {k: v["step"] for k, v in summaries.items()}, "scale": str(scale)}
    return {
        "total": stages.run(
            f"total-seed{seed}", key, lambda: total_errors(run_root, lang, scale.every_setting)
        ),
        "likelihood": stages.run(
            f"likelihood-seed{seed}",
            key,
            lambda: likelihood_gaps(run_root, lang, scale.nelbo_samples),
        ),
        # timing is never reused: it is a measurement of this run's machine
        "speed": speed_ratios(run_root, scale),
    }


def run_frontier(out: Path, scale_name: str, force: bool, stop: StopRequest | None) -> dict:
    scale = check_scale(scale_name)
    started = time.perf_counter()
    torch.set_num_threads(1)
    lang = language()
    spec = symbol_tokenizer(out, "".join(lang.alphabet))
    tokenizer = Tokenizer.from_hf(spec)
    stages = Stages(out, force, stop)
    every = scale.every_setting
    exact = stages.run(
        "sampler",
        {"settings": str(sampler_settings(every))},
        lambda: sampler_errors(lang, tokenizer, every),
    )
    controls = check_positive_controls(exact)
    seeds = {}
    for seed in scale.seeds:
        summaries = train_seed(out, scale, seed, spec, force)
        seeds[seed] = measure_seed(out, seed, scale, summaries, stages) | {
            "training": {
                k: {"step": v["step"], "tokens_seen": v["tokens_seen"]}
                for k, v in summaries.items()
            }
        }
    wall = time.perf_counter() - started
    machine = {"cpu": cpu_name(), "wall_seconds": wall}
    return write_report(out, scale_name, scale, exact, controls, seeds, machine)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--scale", default="cpu", help="smoke (tests) or cpu (the study)")
    parser.add_argument("--force", action="store_true", help="retrain and redo every stage")
    args = parser.parse_args(argv)
    out = Path(args.out)

    def job(stop: StopRequest) -> None:
        check_scale(args.scale)
        paths = run_frontier(out, args.scale, args.force, stop)
        print(f"report: {paths['markdown']}")

    if args.scale not in ("smoke", "cpu"):
        return run_stoppable(lambda stop: check_scale(args.scale))
    return run_stoppable(locked_job(out, args.force, job))


if __name__ == "__main__":
    sys.exit(main())
