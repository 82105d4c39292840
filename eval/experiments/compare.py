"""The main job: train an AR and an MDM model from one preset and compare them side by side.

    python -m eval.experiments.compare --preset demo --out runs/demo [--force]
        [--budget tokens|flops] [--objectives ar,mdm,udm] [training overrides such as
        --max-steps 800 ...]

``--objectives`` names the families (default ``ar,mdm``; ``bd`` and ``udm`` may join, AR must
be there: each diffusion family's M(L) is read against it). Stages, each resumable (its result
is stored under ``<out>/stages/`` and reused by a rerun with the same settings, the same source
of every project module it ran and the same package versions: ``eval.stage_key``; ``--force``
redoes everything):

1. train   every objective from the same preset, corpus, tokenizer, seed and budget;
2. likelihood  AR exact NLL and each diffusion family's NELBO (with its interval) on the same
               validation rows, in bits per byte; the MDM's exact left-to-right NLL on a few rows;
3. generate    unconditional samples: KV-cached AR decoding and each family's diffusion samplers
               at several step counts, plus a temperature sweep; NFE, wall time, FLOPs per token;
4. quality     judge perplexity, unigram entropy, distinct-n, repetition, MAUVE vs held-out text;
5. examples    the same prompts through every model, and an infilling example that only the
               diffusion models can do;

then ``<out>/report.md``, ``report.json`` and the plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from eval.curves import entropy_of_counts
from eval.experiments.compare_budgets import earlier_work, seed_folder, train_budget_points
from eval.experiments.compare_report import write_report
from eval.experiments.compare_samples import (
    CACHE_BLOCKS,
    examples_stage,
    generation_stage,
    quality_stage,
    token_frequencies,
)
from eval.experiments.compare_sections import ReportInputs
from eval.experiments.compare_settings import (
    COMPARABLE,
    CompareSettings,
    diffusion_families,
    objectives_asked,
    settings_for,
    steps_within,
)
from eval.experiments.compare_speed import throughput_stage
from eval.experiments.stages import (
    Stages,
    load,
    locked_job,
    run_stoppable,
    training_overrides,
)
from eval.experiments.synthetic_compare import run_synthetic
from eval.experiments.tuning import tune_learning_rates
from eval.likelihood import evaluate_checkpoint
from eval.report_clean import refuse_unless_clean
from shared.cli_args import CommandParser
from shared.errors import ConfigError
from shared.faults import StopRequest
from shared.training import resolve_config
from shared.training.config import MAX_SEED
from shared.training.run_folder import holds_run


def likelihood_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    results = {}
    for objective in settings.objectives:
        results[objective] = evaluate_checkpoint(
            str(out / objective),
            samples=settings.nelbo_samples,
            chain_rule_rows=settings.chain_rule_rows if objective == "mdm" else 0,
            max_rows=settings.max_val_rows,
            batch_size=32,
        )
    return results


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
    evaluation: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Train the models (or reuse them), run every stage and write the report; returns the
    likelihood results and the report's paths. ``tune_lr`` first sweeps each objective's
    learning rate; ``evaluation``: where the stages and report go (default ``out``)."""
    started = time.perf_counter()
    tuning, own = None, None
    if tune_lr:
        tuning = tune_learning_rates(
            preset,
            out,
            overrides,
            settings.lr_factors,
            settings.tune_fraction,
            force,
            settings.objectives,
        )
        own = {name: {"lr": tuning[name]["chosen"]} for name in settings.objectives}
    runs = train_budget_points(preset, out, overrides, settings, budget, force, own)
    # Likelihood and the examples: the first seed's main-budget runs; every seed's are sampled,
    # judged and timed (the frontier's headline is a mean over them).
    main = seed_folder(out, settings.seeds[0])
    stages = Stages(evaluation or out, force, stop, job=out)
    key = stage_key(runs, settings, settings.seeds[0])
    likelihood = stages.run("likelihood", key, lambda: likelihood_stage(main, settings))
    per_seed = evaluate_seeds(out, runs, settings, stages)
    first = per_seed[settings.seeds[0]]
    examples = stages.run("examples", key, lambda: examples_stage(main, settings))
    inputs = ReportInputs(
        out,
        preset,
        runs,
        likelihood,
        first["sets"],
        first["quality"],
        examples,
        settings,
        time.perf_counter() - started,
        earlier_work(runs) + stages.reused,
        entropy_of_counts(token_frequencies(*load(main, "ar")[1:])),
        tuning,
        first["throughput"],
        per_seed,
        evaluation,
    )
    return likelihood, write_report(inputs)


def evaluate_seeds(
    out: Path, runs: dict[int, dict[str, Any]], settings: CompareSettings, stages: Stages
) -> dict[int, dict[str, Any]]:
    """Every seed's main-budget models sampled, timed and judged (each seed's stages stored
    apart): seed -> {"sets", "throughput", "quality"}."""
    per_seed = {}
    for seed in settings.seeds:
        folder, suffix = seed_folder(out, seed), stage_suffix(seed, settings)
        key = stage_key(runs, settings, seed)
        sets = stages.run(
            f"generate{suffix}",
            key,
            lambda folder=folder: generation_stage(folder, settings),
        )
        throughput = stages.run(
            f"throughput{suffix}",
            key,
            lambda folder=folder: throughput_stage(folder, settings),
        )
        quality = stages.run(
            f"quality{suffix}",
            key,
            lambda folder=folder, sets=sets: quality_stage(folder, sets, settings),
        )
        per_seed[seed] = {"sets": sets, "quality": quality, "throughput": throughput}
    return per_seed


def stage_key(runs: dict[int, dict[str, Any]], settings: CompareSettings, seed: int) -> dict:
    """What a seed's evaluation stages depend on besides their code: its main-budget runs
    (their steps and final losses) and the settings."""
    summaries = runs[seed]["summaries"]
    return {
        "train": {k: (v["step"], v.get("val_nats_per_token")) for k, v in summaries.items()},
        "settings": dataclasses.asdict(settings),
    }


def stage_suffix(seed: int, settings: CompareSettings) -> str:
    """The first seed's stages keep their plain names (``generate``); another seed's carry it
    (``generate-seed1``)."""
    return "" if seed == settings.seeds[0] else f"-seed{seed}"


def with_gen_length(settings: CompareSettings, length: int, max_seq_len: int) -> CompareSettings:
    """``settings`` generating ``length`` tokens per unconditional sample, the step counts cut to
    at most ``length``; refused (one line) when BOS and ``length`` tokens do not fit the
    model's ``max_seq_len`` positions, or when the masked model's cached samplers cannot split
    the canvas into ``CACHE_BLOCKS`` equal blocks."""
    if length < 1:
        raise ConfigError(f"--gen-length {length}: give at least 1 generated token")
    if length > max_seq_len - 1:
        raise ConfigError(
            f"--gen-length {length} does not fit the model: it has {max_seq_len} positions, "
            f"BOS takes one, so a sample holds at most {max_seq_len - 1} generated tokens"
        )
    if "mdm" in settings.objectives and length % CACHE_BLOCKS:
        fits = CACHE_BLOCKS * ((max_seq_len - 1) // CACHE_BLOCKS)
        raise ConfigError(
            f"--gen-length {length}: the masked model's cached samplers decode the canvas in "
            f"{CACHE_BLOCKS} blocks of equal length, so the length must be a multiple of "
            f"{CACHE_BLOCKS} (at most {fits} for this model)"
        )
    steps = steps_within(settings.diffusion_steps, length)
    return dataclasses.replace(settings, gen_length=length, diffusion_steps=steps)


def evaluation_folder(out: Path, length: int, preset_length: int) -> Path | None:
    """Where a job generating ``length`` tokens keeps its stages and report: ``out`` itself at
    the preset's length (None), ``out/gen-length-N`` at another, so that both lengths' reports
    stand side by side over the same trained models."""
    return None if length == preset_length else out / f"gen-length-{length}"


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


def refuse_other_families(out: Path, objectives: tuple[str, ...]) -> None:
    """A job folder's report covers the families it trained: a job asking for fewer or other
    families would rewrite that report without them. More families than the folder has are a
    continuation (the trained ones are reused)."""
    trained = [
        name
        for name in COMPARABLE
        if any(holds_run(folder / name) for folder in out.glob("seed-*"))
    ]
    missing = [name for name in trained if name not in objectives]
    if missing:
        have = ",".join(trained)
        raise ConfigError(
            f"{out} holds the job of objectives {have}; --objectives {','.join(objectives)} "
            f"would rewrite its report without {','.join(missing)}: use another --out for these "
            f"objectives, add them to the folder's (--objectives {have},...), or --force to set "
            "the earlier job aside (moved, not deleted)"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
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
        "each trains every budget point of every objective",
    )
    parser.add_argument(
        "--gen-length",
        type=int,
        default=None,
        help="generated tokens per unconditional sample (default: the preset's, 64 for the "
        "demo); at most the model's positions less one (BOS). Another length than the "
        "preset's evaluates the same trained models into OUT/gen-length-N/",
    )
    parser.add_argument(
        "--objectives",
        default="ar,mdm",
        help="the families trained at the same budget points and compared, comma-separated: ar "
        "and one or more of mdm, bd, udm (each diffusion family's M(L) is read against AR)",
    )
    parser.add_argument(
        "--require-clean",
        action="store_true",
        help="after writing the report, refuse (exit 2) unless it is clean: every run it read "
        "trained at this commit, under this code, with nothing uncommitted",
    )
    return parser


def settings_from_args(args: argparse.Namespace, overrides: dict[str, Any]) -> CompareSettings:
    """The preset's evaluation settings with the command line's judge, MAUVE and seeds (the
    seed is taken out of ``overrides``: the budget points set it per seed)."""
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
    settings = dataclasses.replace(settings, objectives=objectives_asked(args.objectives))
    for name in settings.objectives:  # each family's configuration, before the folder is claimed
        resolve_config(args.preset, overrides | {"objective": name})
    if args.gen_length is not None:
        max_seq_len = resolve_config(args.preset, overrides)[0].max_seq_len
        settings = with_gen_length(settings, args.gen_length, max_seq_len)
    return settings


def comparison_job(
    args: argparse.Namespace,
    out: Path,
    overrides: dict[str, Any],
    settings: CompareSettings,
    started: float,
    stop: StopRequest,
) -> None:
    """Run the comparison in its claimed folder and print the headline likelihoods."""
    if not args.force:
        refuse_other_seeds(out, settings.seeds)
        refuse_other_families(out, settings.objectives)
    preset_length = settings_for(
        args.preset, resolve_config(args.preset, overrides)[0].max_seq_len
    ).gen_length
    likelihood, paths = run_comparison(
        args.preset,
        out,
        overrides,
        settings,
        budget=args.budget,
        force=args.force,
        stop=stop,
        tune_lr=args.tune_lr,
        evaluation=evaluation_folder(out, settings.gen_length, preset_length),
    )
    ar = likelihood["ar"]["estimates"]["nll"]
    print(f"AR  {ar['nats_per_token']:.4f} nats/token, {ar['bits_per_byte']:.4f} bits/byte")
    for name in diffusion_families(settings):
        nelbo = likelihood[name]["estimates"]["nelbo"]
        print(
            f"{name.upper():<3} {nelbo['nats_per_token']:.4f} nats/token (NELBO), "
            f"{nelbo['bits_per_byte']:.4f} bits/byte"
        )
    print(f"report: {paths['markdown']} ({(time.perf_counter() - started) / 60:.1f} min)")
    if args.require_clean:
        refuse_unless_clean(paths["json"])


def main(argv: list[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    out = Path(args.out or f"runs/{args.preset}")
    started = time.perf_counter()

    def job(stop: StopRequest) -> None:
        # Every setting is checked before the job takes its folder: a refusal writes nothing.
        overrides = training_overrides(extra)
        if args.preset.startswith("synthetic"):
            locked_job(
                out,
                args.force,
                lambda stop: synthetic_job(overrides, stop),
                "synthetic compare job",
            )(stop)
            return
        settings = settings_from_args(args, overrides)
        locked_job(
            out,
            args.force,
            lambda stop: comparison_job(args, out, overrides, settings, started, stop),
        )(stop)

    def synthetic_job(overrides: dict[str, Any], stop: StopRequest) -> None:
        paths = run_synthetic(args.preset, out, overrides, args.force, stop)
        print(f"report: {paths['markdown']}")

    return run_stoppable(job)


if __name__ == "__main__":
    sys.exit(main())
