"""The comparison's speed-quality frontier: every sample set's setting timed by the one fair
measurement (``eval.speed.throughput``: warm-up, alternating rounds, median with min/max, generated
tokens only) at each of ``CompareSettings.frontier_batches``, then joined with the set's judge
perplexity and entropy into the frontier section (``eval.speed.frontier``,
``eval.speed.frontier_headline``).

The samples themselves come from the generation stage (one seeded run per setting, which stops at
EOS); the timing generates every position (``eos="none"`` for diffusion, no EOS stop for AR), so
every family's tokens/s counts the same positions."""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generator import DiffusionGenerator
from eval.experiments.compare_curves import sampling_checkpoint
from eval.experiments.compare_samples import diffusion_sampler_configs, load_for_sampling
from eval.experiments.compare_sections import ReportInputs
from eval.experiments.compare_settings import CompareSettings, diffusion_families
from eval.report import Report
from eval.sample_sets import fit_to_blocks
from eval.speed.frontier import points_from_stages
from eval.speed.frontier_headline import report_frontier
from eval.speed.throughput import Throughput, host_probes, measure_batches, merge_runs
from shared import door
from shared.checkpoint import read_state, resolve_checkpoint
from shared.sampling import SamplingConfig


def timed_settings(
    out: Path, settings: CompareSettings
) -> dict[str, Callable[[int], Callable[[], int]]]:
    """For every sample set but the unigram floor: a builder that, given a batch size, returns
    the callable generating one batch and returning its generated-token count."""
    length = settings.gen_length
    model, tokenizer, _ = load_for_sampling(out, "ar")
    ar = ARGenerator(model, tokenizer)
    builders: dict[str, Callable[[int], Callable[[], int]]] = {}

    def ar_builder(config: GenerationConfig) -> Callable[[int], Callable[[], int]]:
        def build(batch: int) -> Callable[[], int]:
            prompts = [[tokenizer.eos_id]] * batch
            return lambda: ar.generate(prompts, config, seed=0).new_tokens

        return build

    for temperature in settings.temperatures:
        sampling = SamplingConfig(temperature=temperature)
        config = GenerationConfig(max_new_tokens=length, stop_on_eos=False, sampling=sampling)
        builders[f"ar T={temperature:g}"] = ar_builder(config)
    for family in diffusion_families(settings):
        engine = DiffusionGenerator(*load_for_sampling(out, family))
        for name, config, _, _ in diffusion_sampler_configs(settings, family):
            builders[name] = diffusion_builder(engine, config, length)
    return builders


def diffusion_builder(engine: DiffusionGenerator, config, length: int):
    def build(batch: int) -> Callable[[], int]:
        canvas = engine.prompt_canvas([[]] * batch, length)
        fitted = fit_to_blocks(config, engine, canvas)

        def run() -> int:
            return sum(len(row) for row in engine.fill(canvas, fitted, seed=0, eos="none").tokens)

        return run

    return build


# Fresh processes the measurement runs in, its rounds split between them: pooled for the
# tokens/s table, each process's own ratios to the AR the replicates of the frontier's speed.
MEASURING_PROCESSES = 3


def throughput_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Every setting timed at every frontier batch size in ``MEASURING_PROCESSES`` fresh
    processes one after another (spawned, with this process's torch threads), each running its
    own warm-up and its share of ``frontier_rounds`` (rounded up); the rounds are pooled
    (``eval.speed.throughput.merge_runs``) for the table of tokens/s, and each process's run is
    kept: the frontier's speed is each setting's ratio to the AR in the same rounds, replicated over
    the processes (``eval.speed.ratios``).

    Fresh, because measured in the job's own process, after training and generation had run
    there, the host probe of per-operation overhead was 20-25% slower than in a fresh process on
    the same host minutes apart, and the batch-1 settings 6-10% slower. Several, because two
    fresh processes minutes apart still differ by up to 10-25% in absolute tokens/s, more than a
    [min, max] over one process's rounds covers (docs/studies/throughput-repeats); three, so
    that a t-interval over them exists with one spare (docs/studies/frontier-reruns)."""
    rounds = math.ceil(settings.frontier_rounds / MEASURING_PROCESSES)
    spawn = multiprocessing.get_context("spawn")
    runs = []
    for _ in range(MEASURING_PROCESSES):
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            job = pool.submit(measure_settings, out, settings, torch.get_num_threads(), rounds)
            runs.append(Throughput.from_dict(job.result()))
    merged = merge_runs(runs)
    merged.setup = measured_setup(out, settings, MEASURING_PROCESSES)
    return merged.as_dict()


def measured_setup(out: Path, settings: CompareSettings, processes: int) -> dict[str, Any]:
    """What the throughput stage measured, recorded beside its numbers so that two measurements
    can be checked to be of the same thing before their speeds are compared
    (``eval.speed.throughput_runs``): the preset and shape of every model timed (from the checkpoint
    its samples come from), the generation (length, no prompt, every position generated), the
    sampler settings behind the settings' names, and the batch sizes, rounds and processes."""
    models = {}
    preset = None
    for family in ("ar", *diffusion_families(settings)):
        checkpoint = resolve_checkpoint(sampling_checkpoint(out / family)[0], log=lambda _: None)
        state = read_state(checkpoint)
        models[family] = {"objective": state.get("objective"), **state["model_config"]}
        preset = preset or run_preset(out / family)
    return {
        "preset": preset,
        "models": models,
        "gen_length": settings.gen_length,
        "prompt": "none (generation starts after BOS; AR's first input is EOS)",
        "eos": "none (every position generated)",
        "temperatures": list(settings.temperatures),
        "diffusion_steps": list(settings.diffusion_steps),
        "bd_block_size": settings.bd_block_size,
        "batch_sizes": list(settings.frontier_batches),
        "rounds": settings.frontier_rounds,
        "warmup": settings.frontier_warmup,
        "processes": processes,
    }


def run_preset(run_dir: Path) -> str | None:
    """The preset a training run was started from, as its config.json records it."""
    try:
        return door.read_json_object(run_dir / "config.json", root=run_dir).get("preset")
    except (OSError, ValueError):
        return None


def measure_settings(
    out: Path, settings: CompareSettings, threads: int, rounds: int
) -> dict[str, Any]:
    """Every setting timed at every frontier batch size (``eval.speed.throughput.measure_batches``),
    with the host probes in the same rounds (what tells a rerun's drift of the host from one of
    the measurement: ``eval.speed.throughput_runs``)."""
    torch.set_num_threads(threads)
    builders = timed_settings(out, settings)
    result = measure_batches(
        lambda name, batch: builders[name](batch),
        list(builders),
        settings.frontier_batches,
        rounds=rounds,
        warmup=settings.frontier_warmup,
        probes=host_probes(),
    )
    return result.as_dict()


def speed_frontier_section(report: Report, inputs: ReportInputs) -> dict[str, Any]:
    """Judge perplexity against fairly measured tokens/s, per batch size (``report_frontier``),
    for every seed's models, with the headline its rule generates (means over seeds, the
    interval of the per-seed ratio)."""
    per_seed = inputs.per_seed or {
        inputs.settings.seeds[0]: {
            "sets": inputs.sets,
            "quality": inputs.quality,
            "throughput": inputs.throughput,
        }
    }
    if any(stage["throughput"] is None for stage in per_seed.values()):
        return {}
    runs = {seed: seed_points(stage) for seed, stage in per_seed.items()}
    first = Throughput.from_dict(per_seed[inputs.settings.seeds[0]]["throughput"])
    report_frontier(report, runs, first)
    return {"speed_frontier": report.results.pop("frontier")}


def seed_points(stage: dict[str, Any]) -> list:
    """One seed's points at every batch size it measured."""
    throughput = Throughput.from_dict(stage["throughput"])
    batches = sorted({record.batch_size for record in throughput.records})
    scores = stage["quality"]["sets"]
    return [
        point
        for batch in batches
        for point in points_from_stages(stage["sets"], scores, throughput, batch)
    ]
