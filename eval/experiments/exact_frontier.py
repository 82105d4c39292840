"""The exact frontier: how far each family's samples are from the truth with the exact
denoiser and with the trained network, and how far those two outputs are from each other,
against the measured speed of the same setting.

    python -m eval.experiments.exact_frontier --out runs/exact-frontier --scale cpu
    python -m eval.experiments.exact_frontier --out runs/exact-frontier-smoke --scale smoke

AR, MDM, BD and UDM are trained on each of two tiny hidden Markov languages
(``exact_frontier_setup.LANGUAGES``) at one budget (same preset, steps, batch and seed), once per
training seed. For every sampler setting the output distribution q is computed exactly
(``eval.synthetic.exact.frontier``) with each exact denoiser of the family
(``exact_frontier_setup.oracles``) and with the trained network; the report gives TV(q, p) of
both and TV(q trained, q exact) between them. The headline is read on the full-support
language ("fixed", where the exact denoiser is unique); ``--headline-language`` naming another
is refused. Speed is measured on the headline language's trained networks
(``eval.speed.throughput.measure``) as a ratio to the AR in the same rounds. The report is
written by ``eval.experiments.exact_frontier_report``.
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
    ESO_TRAINED_ALPHA_0,
    FAMILIES,
    GEN_LENGTH,
    HEADLINE_LANGUAGE,
    LANGUAGES,
    MIN_PROB,
    POSITIVE_CONTROL_TOLERANCE,
    SCALES,
    SEQ_LEN,
    SamplerSetting,
    Scale,
    boundary_share,
    check_headline_language,
    check_scale,
    is_positive_control,
    language,
    language_spec,
    oracles,
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
from eval.report_clean import refuse_unless_clean
from eval.speed.ratios import process_ratios
from eval.speed.throughput import Setting, measure
from eval.synthetic.exact.denoisers import exact_denoiser
from eval.synthetic.exact.frontier import sampler_distribution
from eval.synthetic.exact.outcomes import divergences
from eval.synthetic.likelihood import language_rows, model_estimate
from shared.cli_args import CommandParser
from shared.data.synthetic.hmm import HMMLanguage
from shared.errors import ConfigError
from shared.faults import StopRequest
from shared.hardware import cpu_name
from shared.objective import objective_for_run
from shared.tokenizer import Tokenizer


class PositiveControlFailed(RuntimeError):
    """A setting that is exact with the exact denoiser gave a nonzero divergence."""


def training_overrides(
    scale: Scale, seed: int, tokenizer: str, family: str, language_name: str
) -> dict[str, Any]:
    """One budget for every family; only what the objective itself requires differs (the
    uniform-state objective trains on packed rows, block diffusion has its block size)."""
    shared = dict(
        dataset=language_spec(language_name, scale.corpus),
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


def train_seed(root: Path, scale: Scale, seed: int, tokenizer: str, language_name: str, force):
    summaries = {
        family: train_or_reuse(
            f"{family} {language_name} seed {seed}",
            root / f"seed{seed}" / family,
            "tiny",
            {"objective": family},
            training_overrides(scale, seed, tokenizer, family, language_name),
            force,
        )
        for family in FAMILIES
    }
    check_equal_budgets(summaries, "tokens")
    return summaries


def distribution(family, model, lang, tokenizer, setting: SamplerSetting, state, min_prob):
    return sampler_distribution(
        family,
        model,
        lang,
        tokenizer,
        setting.config(),
        GEN_LENGTH,
        state=state,
        min_prob=min_prob,
    )


def as_pairs(q: dict[str | None, float]) -> list[list]:
    """q as [sample, probability] pairs (JSON keys cannot be None, the invalid sample)."""
    return [[sample, mass] for sample, mass in sorted(q.items(), key=lambda kv: str(kv[0]))]


def sampler_errors(lang: HMMLanguage, tokenizer: Tokenizer, every: bool) -> dict[str, dict]:
    """Every setting's error with each exact denoiser of its family (no training involved):
    setting -> oracle -> divergences to p, the impossible mass and q itself."""
    state = {
        "train_config": {
            "block_size": BLOCK_SIZE,
            "schedule": "linear",
            "alpha_0": ESO_TRAINED_ALPHA_0,
        }
    }
    errors: dict[str, dict] = {}
    for setting in sampler_settings(every):
        errors[setting.name] = {}
        for name, options in oracles(lang, setting.family).items():
            model = exact_denoiser(setting.family, lang, tokenizer, GEN_LENGTH + 1, **options)
            dist = distribution(setting.family, model, lang, tokenizer, setting, state, 0.0)
            errors[setting.name][name] = divergences(dist.q, dist.p) | {
                "impossible": dist.impossible,
                "calls": dist.calls,
                "q": as_pairs(dist.q),
            }
    return errors


def check_positive_controls(errors: dict[str, dict]) -> list[dict[str, Any]]:
    """AR and one-token-per-step random order must be exact with every exact denoiser."""
    checks = []
    for setting in filter(is_positive_control, sampler_settings()):
        if setting.name not in errors:
            raise PositiveControlFailed(f"positive control {setting.name} was not computed")
        for oracle, error in errors[setting.name].items():
            worst = max(abs(error[k]) for k in ("kl_qp", "kl_pq", "tv"))
            checks.append({"setting": setting.name, "oracle": oracle, "max_divergence": worst})
            if not worst <= POSITIVE_CONTROL_TOLERANCE:
                raise PositiveControlFailed(
                    f"positive control failed: {setting.name} with the exact denoiser "
                    f"({oracle}) is {worst:.3g} from the language "
                    f"(must be <= {POSITIVE_CONTROL_TOLERANCE})"
                )
    return checks


def total_errors(
    run_root: Path, lang: HMMLanguage, every: bool, exact: dict[str, dict]
) -> dict[str, dict[str, Any]]:
    """Every setting's error with the trained network of its family: divergences to p, the
    pruned mass and the TV to the q of each exact denoiser of the same setting."""
    loaded = {family: load(run_root, family) for family in FAMILIES}
    errors = {}
    for setting in sampler_settings(every):
        model, tokenizer, state = loaded[setting.family]
        model.eval()
        dist = distribution(setting.family, model, lang, tokenizer, setting, state, MIN_PROB)
        to_exact = {
            oracle: divergences(dist.q, {s: m for s, m in error["q"]})["tv"]
            for oracle, error in exact[setting.name].items()
        }
        errors[setting.name] = divergences(dist.q, dist.p) | {
            "dropped": dist.dropped,
            "calls": dist.calls,
            "tv_to_exact": to_exact,
        }
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


def measure_seed(
    root: Path, seed: int, scale: Scale, summaries: dict, stages: Stages, exact: dict, named
) -> dict:
    """One seed's trained numbers on language ``named`` (name, language, whether headline)."""
    name, lang, headline = named
    run_root = root / f"seed{seed}"
    key = {"seed": seed, "steps": {k: v["step"] for k, v in summaries.items()}, "scale": str(scale)}
    key |= {"language": LANGUAGES[name]}
    measured = {
        "total": stages.run(
            f"{name}-total-seed{seed}",
            key,
            lambda: total_errors(run_root, lang, scale.every_setting, exact),
        ),
        "likelihood": stages.run(
            f"{name}-likelihood-seed{seed}",
            key,
            lambda: likelihood_gaps(run_root, lang, scale.nelbo_samples),
        ),
    }
    if headline:  # timing is never reused: it is a measurement of this run's machine
        measured["speed"] = speed_ratios(run_root, scale)
    return measured


def language_results(out, scale_name, name, headline, tokenizer, spec, stages, force) -> dict:
    """The exact errors, positive controls and every seed's trained numbers on one language."""
    scale, lang, root = SCALES[scale_name], language(name), out / name
    every = scale.every_setting
    exact = stages.run(
        f"{name}-sampler",
        {"settings": str(sampler_settings(every)), "language": LANGUAGES[name]},
        lambda: sampler_errors(lang, tokenizer, every),
    )
    controls = check_positive_controls(exact)
    seeds = {}
    for seed in scale.seeds:
        summaries = train_seed(root, scale, seed, spec, name, force)
        named = (name, lang, headline)
        seeds[seed] = measure_seed(root, seed, scale, summaries, stages, exact, named) | {
            "training": {
                k: {"step": v["step"], "tokens_seen": v["tokens_seen"]}
                for k, v in summaries.items()
            }
        }
    return {
        "exact": exact,
        "controls": controls,
        "seeds": seeds,
        "boundary_share": boundary_share(lang, scale.corpus),
    }


def run_frontier(
    out: Path, scale_name: str, force: bool, stop: StopRequest | None, headline: str
) -> dict:
    scale = check_scale(scale_name)
    check_headline_language(headline)
    started = time.perf_counter()
    torch.set_num_threads(1)
    alphabets = {"".join(language(name).alphabet) for name in LANGUAGES}
    if len(alphabets) != 1:
        raise ValueError(f"the languages must share one alphabet, not {sorted(alphabets)}")
    spec = symbol_tokenizer(out, alphabets.pop())
    tokenizer = Tokenizer.from_hf(spec)
    stages = Stages(out, force, stop)
    names = [headline] + [name for name in LANGUAGES if name != headline]
    results = {
        name: language_results(
            out, scale_name, name, name == headline, tokenizer, spec, stages, force
        )
        for name in names
    }
    wall = time.perf_counter() - started
    machine = {"cpu": cpu_name(), "wall_seconds": wall}
    return write_report(out, scale_name, scale, headline, results, machine)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--scale", default="cpu", help="smoke (tests) or cpu (the study)")
    parser.add_argument("--force", action="store_true", help="retrain and redo every stage")
    parser.add_argument(
        "--headline-language",
        default=HEADLINE_LANGUAGE,
        help=f"the language the headline is read on; only the full-support {HEADLINE_LANGUAGE!r}"
        " (the other language is measured beside it)",
    )
    parser.add_argument(
        "--require-clean",
        action="store_true",
        help="after writing the report, refuse (exit 2) unless it is clean: every network it "
        "read trained at this commit, under this code, with nothing uncommitted",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)

    def job(stop: StopRequest) -> None:
        paths = run_frontier(out, args.scale, args.force, stop, args.headline_language)
        print(f"report: {paths['markdown']}")
        if args.require_clean:
            refuse_unless_clean(paths["json"])

    def check(stop: StopRequest) -> None:
        check_scale(args.scale)
        check_headline_language(args.headline_language)

    try:
        check(None)
    except ConfigError:  # refused before the output folder exists: one line and its status
        return run_stoppable(check)
    return run_stoppable(locked_job(out, args.force, job, "exact frontier job"))


if __name__ == "__main__":
    sys.exit(main())
