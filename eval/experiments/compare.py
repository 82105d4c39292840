"""The main job: train an AR and an MDM model from one preset and compare them side by side.

    python -m eval.experiments.compare --preset demo --out runs/demo [--force]
        [--budget tokens|flops] [training overrides such as --max-steps 800 ...]

Stages, each resumable (its result is stored under ``<out>/stages/`` and reused by a rerun with
the same settings; ``--force`` redoes everything):

1. train   both objectives from the same preset, corpus, tokenizer, seed and budget;
2. likelihood  AR exact NLL and MDM NELBO (with its interval) on the same validation rows, in
               bits per byte; the MDM's exact left-to-right NLL on a few rows;
3. generate    unconditional samples: KV-cached AR decoding and the diffusion samplers at
               several step counts, plus a temperature sweep; NFE, wall time, FLOPs per token;
4. quality     judge perplexity, unigram entropy, distinct-n, repetition, MAUVE vs held-out text;
5. examples    the same prompts through both models, and an infilling example only the MDM can do;

then ``<out>/report.md``, ``report.json`` and the plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import Ancestral, FixedCount, Threshold
from eval.curves import entropy_of_counts
from eval.experiments.compare_budgets import earlier_work, seed_folder, train_budget_points
from eval.experiments.compare_curves import sampling_checkpoint
from eval.experiments.compare_report import write_report
from eval.experiments.compare_settings import CompareSettings, headline_sets, settings_for
from eval.experiments.stages import (
    Stages,
    load,
    locked_job,
    reference_texts,
    run_stoppable,
    training_overrides,
    training_rows,
    validation_rows,
)
from eval.experiments.synthetic_compare import run_synthetic
from eval.experiments.tuning import tune_learning_rates
from eval.likelihood import evaluate_checkpoint
from eval.quality import diversity_report, load_judge, mauve_score
from shared.checkpoint import load_model_from_checkpoint
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.faults import StopRequest
from shared.model import flops_per_token
from shared.sampling import SamplingConfig, sample_categorical
from shared.training import resolve_config
from shared.training.config import MAX_SEED


def likelihood_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    results = {}
    for objective in ("ar", "mdm"):
        results[objective] = evaluate_checkpoint(
            str(out / objective),
            samples=settings.nelbo_samples,
            chain_rule_rows=settings.chain_rule_rows if objective == "mdm" else 0,
            max_rows=settings.max_val_rows,
            batch_size=32,
        )
    return results


def forward_flops_per_token(config: dict[str, Any], context: int) -> float:
    """Inference FLOPs per token position: a third of the training count (forward only)."""
    return flops_per_token(ModelConfig.from_dict(config), context) / 3.0


def load_for_sampling(out: Path, name: str):
    """(model, tokenizer, state) of the checkpoint the run's samples come from (its best one if
    it overfits: see ``sampling_checkpoint``)."""
    return load_model_from_checkpoint(sampling_checkpoint(out / name)[0])


def token_frequencies(tokenizer, state: dict[str, Any]) -> np.ndarray:
    """Counts of each token id over a run's training loss positions, under its tokenizer: the
    unigram model both runs must beat."""
    targets = training_rows(state, tokenizer)[:, 1:]
    return np.bincount(targets[targets != tokenizer.pad_id].ravel())


def unigram_samples(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Samples of the unigram model of the training split (float64 draws, seeded), judged like
    the models' samples: the floor of the quality table."""
    _, tokenizer, state = load(out, "ar")
    counts = token_frequencies(tokenizer, state)
    probs = torch.as_tensor(counts, dtype=torch.float64).expand(settings.samples, -1)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    ids = torch.stack(
        [sample_categorical(probs, generator) for _ in range(settings.gen_length)], dim=1
    ).tolist()
    return {
        "objective": "unigram",
        "sampler": "unigram (training-split frequencies)",
        "temperature": 1.0,
        "steps": None,
        "nfe": 0,
        "seconds": time.perf_counter() - start,
        "texts": [tokenizer.decode(row) for row in ids],
        "ids": ids,
        "flops_per_token": 0.0,
        "approximate": False,
    }


def generation_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Unconditional samples for every setting; texts, ids, NFE, time and FLOPs per token."""
    sets: dict[str, dict[str, Any]] = {}
    length = settings.gen_length

    ar_model, tokenizer, ar_state = load_for_sampling(out, "ar")
    engine = ARGenerator(ar_model, tokenizer)
    ar_flops = forward_flops_per_token(ar_state["model_config"], 1 + length)
    for temperature in tqdm(settings.temperatures, desc="AR decoding", leave=False):
        config = GenerationConfig(
            max_new_tokens=length,
            stop_on_eos=False,
            sampling=SamplingConfig(temperature=temperature),
        )
        name = f"ar T={temperature:g}"
        count = sample_count(name, settings)
        start = time.perf_counter()
        result = engine.generate([[tokenizer.eos_id]] * count, config, seed=0)
        elapsed = time.perf_counter() - start
        sets[name] = {
            "objective": "ar",
            "sampler": "kv-cached ancestral",
            "temperature": temperature,
            "steps": length,
            "nfe": result.forward_passes,
            "seconds": elapsed,
            "texts": result.texts,
            "ids": result.tokens,
            "flops_per_token": ar_flops,
            "approximate": False,
        }

    mdm = DiffusionGenerator(*load_for_sampling(out, "mdm"))
    mdm_flops = forward_flops_per_token(mdm.state["model_config"], 1 + length)
    configs: list[tuple[str, SamplerConfig, float]] = []
    for steps in settings.diffusion_steps:
        configs.append((f"mdm ancestral {steps} steps", SamplerConfig(Ancestral(steps)), 1.0))
        configs.append(
            (
                f"mdm fixed low-conf {steps} steps",
                SamplerConfig(FixedCount(steps, "low_confidence")),
                1.0,
            )
        )
    configs.append(("mdm threshold 0.9", SamplerConfig(Threshold(0.9)), 1.0))
    middle = settings.diffusion_steps[len(settings.diffusion_steps) // 2]
    for temperature in settings.temperatures:
        if temperature != 1.0:
            configs.append(
                (
                    f"mdm ancestral {middle} steps T={temperature:g}",
                    SamplerConfig(
                        Ancestral(middle), sampling=SamplingConfig(temperature=temperature)
                    ),
                    temperature,
                )
            )
    for name, config, temperature in tqdm(configs, desc="diffusion samplers", leave=False):
        canvas = mdm.prompt_canvas([[]] * sample_count(name, settings), length)
        start = time.perf_counter()
        result = mdm.fill(canvas, config, seed=0, eos="stop")
        elapsed = time.perf_counter() - start
        sets[name] = {
            "objective": "mdm",
            "sampler": config.strategy.name,
            "temperature": temperature,
            "steps": getattr(config.strategy, "steps", None),
            "nfe": result.nfe,
            "seconds": elapsed,
            "texts": result.texts,
            "ids": result.tokens,
            # Every evaluation processes the whole canvas; spread over the generated tokens.
            "flops_per_token": result.nfe * canvas.length * mdm_flops / length,
            "approximate": result.approximate,
        }
    sets["unigram model"] = unigram_samples(out, settings)
    for entry in sets.values():
        entry["samples"] = len(entry["texts"])
        entry["tokens_per_s"] = entry["samples"] * length / entry["seconds"]
        entry["nfe_per_token"] = entry["nfe"] / length
    return sets


def sample_count(name: str, settings: CompareSettings) -> int:
    """How many samples a generation setting draws: ``headline_samples`` for the headline sets
    (enough for a judge-perplexity interval of about +-10%), ``samples`` for the others."""
    if name in headline_sets(settings):
        return max(settings.samples, settings.headline_samples)
    return settings.samples


def quality_stage(out: Path, sets: dict[str, Any], settings: CompareSettings) -> dict[str, Any]:
    judge = load_judge(settings.judge)
    count = max(settings.samples, settings.headline_samples, 2)
    references = reference_texts(out, count, settings.gen_length)
    scores: dict[str, Any] = {"judge": judge.identity, "sets": {}}
    reference_score = judge.score(references)
    scores["reference"] = {
        "judge_ppl": reference_score.perplexity,
        **diversity_report(references, [[0]] * len(references)),
    }
    for name, entry in tqdm(sets.items(), desc="judging samples", leave=False):
        texts = [t if t.strip() else " " for t in entry["texts"]]
        judged = judge.score(texts)
        row = {
            "judge_ppl": judged.perplexity,
            "judge_ppl_ci95": judged.perplexity_interval(),
            "samples": len(texts),
            **diversity_report(texts, entry["ids"]),
        }
        main_set = name in headline_sets(settings)
        if settings.mauve and main_set:
            row["mauve"] = mauve_score(texts, references)
        scores["sets"][name] = row
    return scores


def examples_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Side-by-side continuations of the same prompts, and one infilling example."""
    ar_model, tokenizer, state = load_for_sampling(out, "ar")
    mdm = DiffusionGenerator(*load_for_sampling(out, "mdm"))
    rows = validation_rows(state, tokenizer)
    k, length = settings.prompt_tokens, settings.gen_length
    step = max(1, len(rows) // max(settings.prompts, 1))
    prompts = [rows[i * step][1 : 1 + k].tolist() for i in range(settings.prompts)]
    engine = ARGenerator(ar_model, tokenizer)
    start = time.perf_counter()
    ar = engine.generate(
        [[tokenizer.eos_id, *p] for p in prompts],
        GenerationConfig(
            max_new_tokens=length, stop_on_eos=False, sampling=SamplingConfig(temperature=0.8)
        ),
        seed=0,
    )
    ar_seconds = time.perf_counter() - start
    steps = settings.diffusion_steps[-1]
    sampler = SamplerConfig(Ancestral(steps), sampling=SamplingConfig(temperature=0.8))
    start = time.perf_counter()
    continued = mdm.generate(prompts, length, sampler, seed=0, eos="stop")
    mdm_seconds = time.perf_counter() - start
    side_by_side = [
        {"prompt": tokenizer.decode(p), "ar": ar.texts[i], "mdm": continued.texts[i]}
        for i, p in enumerate(prompts)
    ]
    # Infilling: keep a prefix and a suffix of a held-out row, mask the middle.
    row = rows[min(len(rows) - 1, step // 2)]
    middle = min(length, max(4, (len(row) - 1) // 2))
    prefix, suffix = row[1 : 1 + k].tolist(), row[1 + k + middle : 1 + 2 * k + middle].tolist()
    fixed = {1 + i: t for i, t in enumerate(prefix)}
    fixed |= {1 + k + middle + j: t for j, t in enumerate(suffix)}
    infill = mdm.infill_canvas(1 + 2 * k + middle if suffix else 1 + k + middle, fixed)
    filled = mdm.fill(infill, sampler, seed=0, eos="none").raw
    ar_prefix_only = engine.generate(
        [[tokenizer.eos_id, *prefix]],
        GenerationConfig(
            max_new_tokens=middle, stop_on_eos=False, sampling=SamplingConfig(temperature=0.8)
        ),
        seed=0,
    )
    return {
        "side_by_side": side_by_side,
        "ar_seconds_per_sample": ar_seconds / len(prompts),
        "mdm_seconds_per_sample": mdm_seconds / len(prompts),
        "ar_nfe": ar.forward_passes,
        "mdm_nfe": continued.nfe,
        "mdm_steps": steps,
        "infill": {
            "prefix": tokenizer.decode(prefix),
            "suffix": tokenizer.decode(suffix),
            "original_middle": tokenizer.decode(row[1 + k : 1 + k + middle].tolist()),
            "mdm_middle": tokenizer.decode(filled.tokens[0, 1 + k : 1 + k + middle].tolist()),
            "ar_prefix_only": ar_prefix_only.texts[0],
        },
    }


def run_comparison(
    preset: str,
    out: Path,
    overrides: dict[str, Any],
    settings: CompareSettings,
    *,
    budget: str = "tokens",
    force: bool = False,
    stop: StopRequest | None = None,
    tune_lr: bool = False,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Train both models (or reuse them), run every stage and write the report; returns the
    likelihood results and the report's paths. ``tune_lr`` first sweeps each objective's
    learning rate and trains each with its own choice."""
    started = time.perf_counter()
    tuning, own = None, None
    if tune_lr:
        tuning = tune_learning_rates(
            preset, out, overrides, settings.lr_factors, settings.tune_fraction, force
        )
        own = {objective: {"lr": tuning[objective]["chosen"]} for objective in ("ar", "mdm")}
    runs = train_budget_points(preset, out, overrides, settings, budget, force, own)
    # The evaluation stages look at the first seed's main-budget runs.
    main = seed_folder(out, settings.seeds[0])
    summaries = runs[settings.seeds[0]]["summaries"]
    stages = Stages(out, force, stop)
    key = {
        "train": {k: (v["step"], v.get("val_nats_per_token")) for k, v in summaries.items()},
        "settings": dataclasses.asdict(settings),
    }
    likelihood = stages.run("likelihood", key, lambda: likelihood_stage(main, settings))
    sets = stages.run("generate", key, lambda: generation_stage(main, settings))
    quality = stages.run("quality", key, lambda: quality_stage(main, sets, settings))
    examples = stages.run("examples", key, lambda: examples_stage(main, settings))
    reused = earlier_work(runs)
    paths = write_report(
        out,
        preset,
        runs,
        likelihood,
        sets,
        quality,
        examples,
        settings,
        time.perf_counter() - started,
        reused + stages.reused,
        entropy_of_counts(token_frequencies(*load(main, "ar")[1:])),
        tuning,
    )
    return likelihood, paths


def seeds_asked(seeds: str | None, seed: int | None) -> tuple[int, ...] | None:
    """The seeds ``--seeds 0,1,2`` (or train.py's ``--seed N``) asks for; None: the preset's."""
    if seeds is not None and seed is not None:
        raise ConfigError("give the training seeds once: --seeds 0,1,2 or --seed N, not both")
    if seed is not None:
        return (seed,)
    if seeds is None:
        return None
    try:
        values = tuple(int(part) for part in seeds.split(","))
    except ValueError:
        raise ConfigError(f"--seeds {seeds!r} must be integers separated by commas") from None
    if len(set(values)) != len(values) or any(not 0 <= v <= MAX_SEED for v in values):
        raise ConfigError(
            f"--seeds {seeds!r} must be distinct integers >= 0 and <= {MAX_SEED} (2**32 - 1)"
        )
    return values


def refuse_other_seeds(out: Path, seeds: tuple[int, ...]) -> None:
    """A job folder's report covers the seeds it trained: a job asking for other seeds would
    rewrite that report (and its stages) for fewer or different seeds. More seeds than the
    folder has are a continuation (the trained ones are reused)."""
    trained = sorted(
        int(folder.name.removeprefix("seed-"))
        for folder in out.glob("seed-*")
        if folder.is_dir() and folder.name.removeprefix("seed-").isdigit()
    )
    missing = [seed for seed in trained if seed not in seeds]
    if missing:
        asked = ",".join(str(seed) for seed in seeds)
        have = ",".join(str(seed) for seed in trained)
        raise ConfigError(
            f"{out} holds the job of seeds {have}; --seeds {asked} would rewrite its report "
            f"without seed(s) {','.join(str(s) for s in missing)}: use another --out for these "
            f"seeds, add them to the folder's (--seeds {have},...), or --force to set the earlier "
            "job aside (moved, not deleted)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--out", default=None, help="output directory (default runs/<preset>)")
    parser.add_argument("--force", action="store_true", help="redo every stage")
    parser.add_argument(
        "--budget",
        choices=["tokens", "flops"],
        default="tokens",
        help="what the two models are matched on",
    )
    parser.add_argument("--no-mauve", action="store_true", help="skip MAUVE")
    parser.add_argument(
        "--tune-lr",
        action="store_true",
        help="sweep each objective's learning rate (short runs, reused when present) first",
    )
    parser.add_argument("--judge", default=None, help="judge model (default: smollm2 wheel)")
    parser.add_argument(
        "--seeds",
        default=None,
        help="training seeds, comma-separated (default: the preset's; --seed N is --seeds N); "
        "each trains every budget point of both objectives",
    )
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out or f"runs/{args.preset}")
    started = time.perf_counter()

    def job(stop: StopRequest) -> None:
        # Every setting is checked before the job takes its folder: a refusal writes nothing.
        overrides = training_overrides(extra)
        if args.preset.startswith("synthetic"):
            locked_job(out, args.force, lambda stop: synthetic_job(overrides, stop))(stop)
            return
        settings = settings_for(args.preset, resolve_config(args.preset, overrides)[0].max_seq_len)
        if args.no_mauve or args.judge:
            settings = dataclasses.replace(
                settings,
                mauve=settings.mauve and not args.no_mauve,
                judge=args.judge or settings.judge,
            )
        seeds = seeds_asked(args.seeds, overrides.pop("seed", None))
        if seeds:
            settings = dataclasses.replace(settings, seeds=seeds)
        locked_job(out, args.force, lambda stop: comparison_job(overrides, settings, stop))(stop)

    def synthetic_job(overrides: dict[str, Any], stop: StopRequest) -> None:
        paths = run_synthetic(args.preset, out, overrides, args.force, stop)
        print(f"report: {paths['markdown']}")

    def comparison_job(
        overrides: dict[str, Any], settings: CompareSettings, stop: StopRequest
    ) -> None:
        if not args.force:
            refuse_other_seeds(out, settings.seeds)
        likelihood, paths = run_comparison(
            args.preset,
            out,
            overrides,
            settings,
            budget=args.budget,
            force=args.force,
            stop=stop,
            tune_lr=args.tune_lr,
        )
        ar, mdm = likelihood["ar"]["estimates"]["nll"], likelihood["mdm"]["estimates"]["nelbo"]
        print(f"AR  {ar['nats_per_token']:.4f} nats/token, {ar['bits_per_byte']:.4f} bits/byte")
        print(
            f"MDM {mdm['nats_per_token']:.4f} nats/token (NELBO), "
            f"{mdm['bits_per_byte']:.4f} bits/byte"
        )
        print(f"report: {paths['markdown']} ({(time.perf_counter() - started) / 60:.1f} min)")

    return run_stoppable(job)


if __name__ == "__main__":
    sys.exit(main())
