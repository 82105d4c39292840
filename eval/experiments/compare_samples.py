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
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import Ancestral, FixedCount, Threshold
from eval.experiments.compare_curves import sampling_checkpoint
from eval.experiments.compare_settings import CompareSettings, headline_sets
from eval.experiments.stages import load, reference_texts, training_rows, validation_rows
from eval.quality import diversity_report, load_judge, mauve_score
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
    sets = ar_sample_sets(out, settings) | diffusion_sample_sets(out, settings)
    sets["unigram model"] = unigram_samples(out, settings)
    for entry in sets.values():
        entry["samples"] = len(entry["texts"])
        entry["tokens_per_s"] = entry["samples"] * settings.gen_length / entry["seconds"]
        entry["nfe_per_token"] = entry["nfe"] / settings.gen_length
    return sets


def ar_sample_sets(out: Path, settings: CompareSettings) -> dict[str, dict[str, Any]]:
    """KV-cached AR decoding at every temperature of the sweep."""
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
    return sets


def diffusion_sampler_configs(settings: CompareSettings) -> list[tuple[str, SamplerConfig, float]]:
    """(name, sampler, temperature) of every MDM setting: ancestral and fixed-count
    low-confidence at each step count, a confidence threshold, and the temperature sweep at the
    middle step count."""
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
    return configs


def diffusion_sample_sets(out: Path, settings: CompareSettings) -> dict[str, dict[str, Any]]:
    """The MDM's samples under every setting of ``diffusion_sampler_configs``."""
    sets: dict[str, dict[str, Any]] = {}
    length = settings.gen_length
    mdm = DiffusionGenerator(*load_for_sampling(out, "mdm"))
    mdm_flops = forward_flops_per_token(mdm.state["model_config"], 1 + length)
    configs = diffusion_sampler_configs(settings)
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
