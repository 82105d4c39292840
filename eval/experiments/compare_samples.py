"""The comparison's sampling stages: unconditional samples of every model and sampler, the unigram
floor, their judged quality, and the side-by-side and infilling examples."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from arlm.generate import ARGenerator, GenerationConfig
from dllm.eso.sampler import EsoSamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.remdm import RELEASED_ETA, RELEASED_LOOP_TIMES, Remdm
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, EntropyBounded, FixedCount, Threshold
from dllm.uniform.sampler import UniformSamplerConfig
from eval.experiments.compare_curves import sampling_checkpoint
from eval.experiments.compare_settings import CompareSettings, diffusion_families, headline_sets
from eval.experiments.stages import (
    held_out,
    load,
    training_rows,
    validation_rows,
)
from eval.quality import load_judge, mauve_score
from eval.sample_sets import (
    EOS_POLICY,
    PERPLEXITY_DEFINITION,
    ar_sample_set,
    before_eos,
    diffusion_sample_set,
    fit_to_blocks,
    judged,
    judged_texts,
    sampler_steps,
)
from shared.checkpoint import load_model_from_checkpoint
from shared.config import ModelConfig
from shared.model import flops_per_token
from shared.sampling import SamplingConfig, sample_categorical


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
    ids = [before_eos(row, tokenizer.eos_id) for row in ids]
    return {
        "objective": "unigram",
        "sampler": "unigram (training-split frequencies)",
        "temperature": 1.0,
        "steps": None,
        "nfe": 0,
        "seconds": time.perf_counter() - start,
        "texts": [tokenizer.decode(row) for row in ids],
        "ids": ids,
        "lengths": [len(row) for row in ids],
        "flops_per_token": 0.0,
        "approximate": False,
    }


def generation_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Unconditional samples for every setting; texts, ids, NFE, time and FLOPs per token."""
    sets = ar_sample_sets(out, settings)
    for family in diffusion_families(settings):
        sets |= diffusion_sample_sets(out, settings, family)
    sets["unigram model"] = unigram_samples(out, settings)
    for entry in sets.values():
        entry["samples"] = len(entry["texts"])
        entry["tokens_per_s"] = entry["samples"] * settings.gen_length / entry["seconds"]
        entry["nfe_per_token"] = entry["nfe"] / settings.gen_length
    return sets


def ar_sample_sets(out: Path, settings: CompareSettings) -> dict[str, dict[str, Any]]:
    """KV-cached AR decoding at every temperature of the sweep (``eval.sample_sets``: samples
    end at their first EOS, as every family's do)."""
    sets: dict[str, dict[str, Any]] = {}
    length = settings.gen_length
    ar_model, tokenizer, ar_state = load_for_sampling(out, "ar")
    engine = ARGenerator(ar_model, tokenizer)
    ar_flops = forward_flops_per_token(ar_state["model_config"], 1 + length)
    for temperature in tqdm(settings.temperatures, desc="AR decoding", leave=False):
        name = f"ar T={temperature:g}"
        sampling = SamplingConfig(temperature=temperature)
        drawn = ar_sample_set(engine, sample_count(name, settings), length, sampling, seed=0)
        sets[name] = drawn.record() | {
            "objective": "ar",
            "sampler": "kv-cached ancestral",
            "temperature": temperature,
            "flops_per_token": ar_flops,
        }
    return sets


# The entropy-bounded sampler's budget in the main job, fixed before any run: 0.1 nats, the
# largest setting at which the EB paper's code models kept their accuracy (Dream, MBPP).
EB_GAMMA = 0.1

# ReMDM's loop in the main job, fixed before any run: its released setting (arXiv 2503.00307):
# alpha rises to 0.9 by t = 0.55, holds there to t = 0.05 remasking with sigma = min(0.02,
# sigma_max), then rises to 1; at every step count of the masked family, beside its ancestral.
REMDM_LOOP = dict(mode="loop", eta=RELEASED_ETA, **RELEASED_LOOP_TIMES)

# (set name, sampler, temperature, sampler label) of one diffusion sample set
SamplerSetting = tuple[str, "SamplerConfig | UniformSamplerConfig", float, str]


def diffusion_sampler_configs(
    settings: CompareSettings, family: str = "mdm"
) -> list[SamplerSetting]:
    """Every sample set of one diffusion family. Masked families (mdm, bd): ancestral and
    fixed-count low-confidence at each step count, a confidence threshold and the
    entropy-bounded sampler at ``EB_GAMMA``; mdm also ReMDM's loop (``REMDM_LOOP``) at each
    step count. Uniform-state (udm):
    ancestral at each step count and the same with a greedy last step (remasking and thresholds
    rank [MASK] positions, which a udm canvas does not have). Eso-LM (eso): its own sampler, the
    diffusion phase in each step count, the rest left to right. All: the temperature sweep of the
    ancestral sampler at the middle step count."""
    ancestral = {"udm": uniform_ancestral, "eso": eso_sampler}.get(family, masked_ancestral)
    configs: list[SamplerSetting] = []
    for steps in settings.diffusion_steps:
        configs.append((f"{family} ancestral {steps} steps", ancestral(steps, 1.0), 1.0, ""))
        if family == "udm":
            greedy_tail = UniformSamplerConfig(steps, greedy_tail=True)
            configs.append((f"udm greedy-tail {steps} steps", greedy_tail, 1.0, "greedy-tail"))
        elif family != "eso":
            fixed = SamplerConfig(FixedCount(steps, "low_confidence"))
            configs.append((f"{family} fixed low-conf {steps} steps", fixed, 1.0, ""))
        if family == "mdm":
            loop = SamplerConfig(Remdm(steps, **REMDM_LOOP))
            configs.append((f"mdm remdm loop {steps} steps", loop, 1.0, "remdm loop"))
    if family not in ("udm", "eso"):
        threshold = SamplerConfig(Threshold(0.9))
        configs.append((f"{family} threshold 0.9", threshold, 1.0, ""))
        eb = SamplerConfig(EntropyBounded(EB_GAMMA))
        configs.append((f"{family} eb {EB_GAMMA:g}", eb, 1.0, ""))
    if family == "mdm":
        configs += cached_settings(settings)
    middle = settings.diffusion_steps[len(settings.diffusion_steps) // 2]
    for temperature in settings.temperatures:
        if temperature != 1.0:
            name = f"{family} ancestral {middle} steps T={temperature:g}"
            configs.append((name, ancestral(middle, temperature), temperature, ""))
    return configs


# Fast-dLLM's caches refresh once per block of semi-autoregressive decoding: the canvas is
# decoded in this many blocks when a cache is on.
CACHE_BLOCKS = 4


def cached_settings(settings: CompareSettings) -> list[SamplerSetting]:
    """The masked model's Fast-dLLM recipes, with its APPROXIMATE caches (named so in the set's
    name and sampler): the confidence threshold with the prefix and the dual cache, and
    low-confidence decoding at one token per step with the dual cache, each over
    ``CACHE_BLOCKS`` blocks."""
    block = max(1, settings.gen_length // CACHE_BLOCKS)
    configs: list[SamplerSetting] = []
    for cache, label in (("approx_prefix", "prefix"), ("approx_dual", "dual")):
        config = SamplerConfig(Threshold(0.9), block_length=block, cache=cache)
        name = f"mdm threshold 0.9 {label} cache (approx.)"
        configs.append((name, config, 1.0, f"threshold + approx. {label} cache"))
    steps = settings.gen_length
    config = SamplerConfig(
        FixedCount(steps, "low_confidence"), block_length=block, cache="approx_dual"
    )
    name = f"mdm fixed low-conf {steps} steps dual cache (approx.)"
    configs.append((name, config, 1.0, "low_confidence + approx. dual cache"))
    return configs


def masked_ancestral(steps: int, temperature: float) -> SamplerConfig:
    if temperature == 1.0:
        return SamplerConfig(Ancestral(steps))
    return SamplerConfig(Ancestral(steps), sampling=SamplingConfig(temperature=temperature))


def uniform_ancestral(steps: int, temperature: float) -> UniformSamplerConfig:
    return UniformSamplerConfig(steps, sampling=SamplingConfig(temperature=temperature))


def eso_sampler(steps: int, temperature: float) -> EsoSamplerConfig:
    """Eso-LM's sampler: ``steps`` diffusion steps at the model's alpha_0, then the rest
    left to right."""
    return EsoSamplerConfig(steps, sampling=SamplingConfig(temperature=temperature))


def example_sampler(family: str, steps: int) -> SamplerConfig | UniformSamplerConfig:
    """The examples' sampler: ancestral at the most steps, temperature 0.8."""
    if family == "udm":
        return uniform_ancestral(steps, 0.8)
    if family == "eso":
        return eso_sampler(steps, 0.8)
    return SamplerConfig(Ancestral(steps), sampling=SamplingConfig(temperature=0.8))


def sampler_label(config: SamplerConfig | UniformSamplerConfig, label: str) -> str:
    """The sampler's name in the report: the masked strategy's, "ancestral" for udm's and
    "diffusion then left to right" for Eso-LM's."""
    if label:
        return label
    if isinstance(config, EsoSamplerConfig):
        return "diffusion then left to right"
    return "ancestral" if isinstance(config, UniformSamplerConfig) else config.strategy.name


def diffusion_sample_sets(
    out: Path, settings: CompareSettings, family: str = "mdm"
) -> dict[str, dict[str, Any]]:
    """One diffusion family's samples under every setting of ``diffusion_sampler_configs``
    (``eval.sample_sets``: cut at their first EOS)."""
    sets: dict[str, dict[str, Any]] = {}
    length = settings.gen_length
    engine = DiffusionGenerator(*load_for_sampling(out, family))
    flops = forward_flops_per_token(engine.state["model_config"], 1 + length)
    configs = diffusion_sampler_configs(settings, family)
    for name, config, temperature, label in tqdm(configs, desc=f"{family} samplers", leave=False):
        drawn = diffusion_sample_set(engine, config, sample_count(name, settings), length, seed=0)
        sets[name] = drawn.record() | {
            "objective": family,
            "sampler": sampler_label(config, label),
            "temperature": temperature,
            "flops_per_token": sampling_flops_per_token(family, drawn.nfe, length, flops),
        }
    return sets


def sampling_flops_per_token(family: str, nfe: int, length: int, flops: float) -> float:
    """Network FLOPs per generated token. A masked or uniform evaluation processes the whole
    canvas (BOS and the generation region), spread over the generated positions; Eso-LM's KV
    cache processes each position twice (a [MASK] query, then a clean key) and BOS once."""
    if family == "eso":
        return (2 * length + 1) * flops / length
    return nfe * (1 + length) * flops / length


def sample_count(name: str, settings: CompareSettings) -> int:
    """How many samples a generation setting draws: ``headline_samples`` for the headline sets
    (enough for a judge-perplexity interval of about +-10%), ``samples`` for the others."""
    if name in headline_sets(settings):
        return max(settings.samples, settings.headline_samples)
    return settings.samples


def quality_stage(out: Path, sets: dict[str, Any], settings: CompareSettings) -> dict[str, Any]:
    """Every sample set judged the one way (``eval.sample_sets.judged``), and held-out text cut
    the way the samples are (its first EOS, the samples' length) as the reference."""
    judge = load_judge(settings.judge)
    count = max(settings.samples, settings.headline_samples, 2)
    reference_ids, references, held_out_text = held_out(out, count, settings.gen_length)
    scores: dict[str, Any] = {
        "judge": judge.identity,
        "eos_policy": EOS_POLICY,
        "perplexity": PERPLEXITY_DEFINITION,
        "sets": {},
    }
    scores["reference"] = judged(judge, references, reference_ids)
    for name, entry in tqdm(sets.items(), desc="judging samples", leave=False):
        # the bounds the frontier marks a set by: held-out text of the set's own lengths
        # (one set size for every set: the largest, so no bound is widened by fewer samples)
        row = judged(judge, entry["texts"], entry["ids"]) | held_out_text.bounds(
            entry["lengths"], count
        )
        if settings.mauve and name in headline_sets(settings):
            row["mauve"] = mauve_score(judged_texts(entry["texts"]), references)
        scores["sets"][name] = row
    return scores


def examples_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Side-by-side continuations of the same prompts by every model, and one infilling example
    (a prefix and a suffix kept, the middle generated) for every diffusion family that sees the
    suffix (mdm, udm)."""
    ar_model, tokenizer, state = load_for_sampling(out, "ar")
    families = diffusion_families(settings)
    engines = {name: DiffusionGenerator(*load_for_sampling(out, name)) for name in families}
    rows = validation_rows(state, tokenizer)
    k = settings.prompt_tokens
    # BOS, the prompt and the continuation fit the model (a long --gen-length is cut here)
    length = min(settings.gen_length, ar_model.config.max_seq_len - 1 - k)
    step = max(1, len(rows) // max(settings.prompts, 1))
    prompts = [rows[i * step][1 : 1 + k].tolist() for i in range(settings.prompts)]
    engine = ARGenerator(ar_model, tokenizer)
    start = time.perf_counter()
    ar = engine.generate([[tokenizer.eos_id, *p] for p in prompts], ar_sampler(length), seed=0)
    seconds = {"ar": time.perf_counter() - start}
    steps = settings.diffusion_steps[-1]
    continued, used_steps = {}, {}
    for name, diffusion in engines.items():
        canvas = diffusion.prompt_canvas(prompts, length)
        sampler = fit_to_blocks(example_sampler(name, steps), diffusion, canvas)
        start = time.perf_counter()
        continued[name] = diffusion.fill(canvas, sampler, seed=0, eos="stop")
        seconds[name] = time.perf_counter() - start
        used_steps[name] = sampler_steps(sampler)
    side_by_side = [
        {"prompt": tokenizer.decode(p), "ar": ar.texts[i]}
        | {name: result.texts[i] for name, result in continued.items()}
        for i, p in enumerate(prompts)
    ]
    row = rows[min(len(rows) - 1, step // 2)]
    return {
        "side_by_side": side_by_side,
        **{f"{name}_seconds_per_sample": s / len(prompts) for name, s in seconds.items()},
        "ar_nfe": ar.forward_passes,
        **{f"{name}_nfe": result.nfe for name, result in continued.items()},
        **{f"{name}_steps": used for name, used in used_steps.items()},
        "infill": infill_example(row, engine, engines, tokenizer, settings),
    }


def ar_sampler(length: int) -> GenerationConfig:
    """The examples' AR decoding: ``length`` tokens at temperature 0.8."""
    return GenerationConfig(
        max_new_tokens=length, stop_on_eos=False, sampling=SamplingConfig(temperature=0.8)
    )


def infill_example(
    row: np.ndarray,
    engine: ARGenerator,
    engines: dict[str, DiffusionGenerator],
    tokenizer,
    settings: CompareSettings,
) -> dict[str, str]:
    """Keep a prefix and a suffix of a held-out row and generate the middle: with every
    diffusion family that sees the suffix, and with the AR model from the prefix alone."""
    k, steps = settings.prompt_tokens, settings.diffusion_steps[-1]
    middle = min(settings.gen_length, max(4, (len(row) - 1) // 2))
    prefix, suffix = row[1 : 1 + k].tolist(), row[1 + k + middle : 1 + 2 * k + middle].tolist()
    fixed = {1 + i: t for i, t in enumerate(prefix)}
    fixed |= {1 + k + middle + j: t for j, t in enumerate(suffix)}
    middles = {}
    for name, diffusion in engines.items():
        if name == "bd":  # block-causal: a block never sees the blocks after it (the suffix)
            continue
        infill = diffusion.infill_canvas(1 + 2 * k + middle if suffix else 1 + k + middle, fixed)
        sampler = fit_to_blocks(example_sampler(name, steps), diffusion, infill)
        filled = diffusion.fill(infill, sampler, seed=0, eos="none").raw
        middles[f"{name}_middle"] = tokenizer.decode(
            filled.tokens[0, 1 + k : 1 + k + middle].tolist()
        )
    ar_prefix_only = engine.generate([[tokenizer.eos_id, *prefix]], ar_sampler(middle), seed=0)
    return {
        "prefix": tokenizer.decode(prefix),
        "suffix": tokenizer.decode(suffix),
        "original_middle": tokenizer.decode(row[1 + k : 1 + k + middle].tolist()),
        **middles,
        "ar_prefix_only": ar_prefix_only.texts[0],
    }
