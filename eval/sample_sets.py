"""One way to draw and judge a sample set, for every family and sampler: the main job, its
frontier, the block-size sweep and the findings all call these, so their numbers mean the same.

**EOS policy: every sample ends at its first EOS, whatever the family.** AR decoding stops there
(``stop_on_eos=True``) and a diffusion canvas is cut there (``eos="stop"``). A document ends at
EOS; what a model writes after it is the start of another, unprompted document. Run through EOS,
AR text would cross document boundaries while diffusion text stops at them, and the judge would
score two different things. The ids kept are those before the EOS (the EOS itself has no text),
and every sample's length is recorded, so a family whose samples end early is seen as such.

**Perplexity is token-weighted:** exp(the judge's nats summed over every sample / the judge's
tokens summed over every sample), with a 95% interval over samples by the delta method
(``eval.quality.log_perplexity_interval``). A long sample counts for more than a short one, as
in the per-token perplexity of held-out text.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from arlm.generate import ARGenerator, GenerationConfig
from dllm.block.sampler import grid_blocks
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.uniform.sampler import UniformSamplerConfig
from eval.quality import Z95, Judge, diversity_report, repetition_rate, unigram_entropy
from shared.sampling import SamplingConfig

EOS_POLICY = "every family's samples end at their first EOS (AR stops there, a canvas is cut there)"
PERPLEXITY_DEFINITION = (
    "token-weighted: exp(judge nats summed over all samples / judge tokens summed over all "
    "samples), 95% interval over samples by the delta method"
)

DiffusionSampler = SamplerConfig | UniformSamplerConfig


@dataclass
class SampleSet:
    """What one sampler setting drew: texts, the ids before each sample's first EOS, network
    evaluations and the seconds the draw took (not a fair timing: ``eval.speed.throughput`` is)."""

    texts: list[str]
    ids: list[list[int]]
    nfe: int
    seconds: float
    steps: int | None = None  # the sampler's steps as run (block diffusion rounds them up)
    approximate: bool = False  # drawn with an approximate cache
    # network evaluations each sample took: AR one per token it generated (its EOS included),
    # a canvas sampler every evaluation of the canvas (None: nfe for every sample)
    sample_nfe: list[int] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(row) for row in self.ids]

    @property
    def nfe_per_sample(self) -> list[int]:
        return self.sample_nfe if self.sample_nfe is not None else [self.nfe] * len(self.ids)

    @property
    def tokens_per_forward(self) -> float | None:
        """TPF as the dLLM leaderboard defines it: valid generated tokens (before the first
        EOS) over network evaluations, both summed over the samples. AR is at most 1."""
        evaluations = sum(self.nfe_per_sample)
        return sum(self.lengths) / evaluations if evaluations else None

    def record(self) -> dict[str, Any]:
        """The set as the stages store it."""
        return {
            "texts": self.texts,
            "ids": self.ids,
            "lengths": self.lengths,
            "nfe": self.nfe,
            "seconds": self.seconds,
            "steps": self.steps,
            "approximate": self.approximate,
            "nfe_per_sample": statistics.fmean(self.nfe_per_sample) if self.ids else None,
            "tpf": self.tokens_per_forward,
        }


def before_eos(ids, eos_id: int | None) -> list[int]:
    """A sample's token ids before its first EOS."""
    ids = list(ids)
    return ids[: ids.index(eos_id)] if eos_id is not None and eos_id in ids else ids


def ar_sample_set(
    engine: ARGenerator, count: int, length: int, sampling: SamplingConfig, seed: int
) -> SampleSet:
    """``count`` unprompted AR samples of at most ``length`` tokens, each from a lone EOS (the
    document boundary every training row starts after), ending at their first EOS."""
    eos = engine.tokenizer.eos_id
    config = GenerationConfig(max_new_tokens=length, stop_on_eos=True, sampling=sampling)
    start = time.perf_counter()
    result = engine.generate([[eos]] * count, config, seed=seed)
    seconds = time.perf_counter() - start
    ids = [before_eos(row, eos) for row in result.tokens]
    # each generated token (the EOS that ends a sample too) took one evaluation of its row
    sample_nfe = [len(row) for row in result.tokens]
    return SampleSet(
        result.texts, ids, result.forward_passes, seconds, steps=length, sample_nfe=sample_nfe
    )


def sampler_steps(config: DiffusionSampler) -> int | None:
    if not hasattr(config, "strategy"):  # the uniform-state and Eso samplers' own settings
        return config.steps
    return getattr(config.strategy, "steps", None)


def fit_to_blocks(config: DiffusionSampler, engine: DiffusionGenerator, canvas) -> DiffusionSampler:
    """A block diffusion sampler gives every block of the canvas the same number of steps:
    round a step count up to a multiple of the blocks (the steps recorded say how many ran).
    Other families' samplers unchanged."""
    steps = sampler_steps(config)
    if engine.block_size is None or steps is None:
        return config
    blocks = len(grid_blocks(canvas.region, engine.block_size, canvas.length))
    if steps % blocks == 0:
        return config
    rounded = blocks * math.ceil(steps / blocks)
    return dataclasses.replace(config, strategy=dataclasses.replace(config.strategy, steps=rounded))


def diffusion_sample_set(
    engine: DiffusionGenerator,
    sampler: DiffusionSampler,
    count: int,
    length: int,
    seed: int,
    *,
    early_stop: bool = True,
) -> SampleSet:
    """``count`` unprompted samples of a ``length``-position canvas, cut at their first EOS.
    ``early_stop`` (block diffusion): end after the block where every row has its EOS (same
    texts, fewer evaluations); False runs every block, as a fixed-cost comparison wants."""
    canvas = engine.prompt_canvas([[]] * count, length)
    sampler = fit_to_blocks(sampler, engine, canvas)
    start = time.perf_counter()
    result = engine.fill(canvas, sampler, seed=seed, eos="stop", early_stop=early_stop)
    seconds = time.perf_counter() - start
    return SampleSet(
        result.texts,
        [list(row) for row in result.tokens],
        result.nfe,
        seconds,
        steps=sampler_steps(sampler),
        approximate=result.approximate,
    )


def judged_texts(texts: Sequence[str]) -> list[str]:
    """The texts as the judge (and MAUVE) read them: an empty sample (EOS first) as one space,
    so it still counts as a sample."""
    return [text if text.strip() else " " for text in texts]


def judged(judge: Judge, texts: list[str], ids: list[list[int]]) -> dict[str, Any]:
    """A sample set's judge perplexity (token-weighted, with its interval over samples), its
    per-sample nats and tokens (what pools over seeds), its lengths and diversity statistics.
    An empty sample (EOS first) is judged as one space, so it still counts as a sample."""
    texts = judged_texts(texts)
    score = judge.score(texts)
    return {
        "judge_ppl": score.perplexity,
        "judge_ppl_ci95": score.perplexity_interval(),
        "judge_nats": score.nats,
        "judge_tokens": score.tokens,
        "per_sample_nats": score.per_sample_nats_per_token,
        "per_sample_tokens": score.per_sample_tokens,
        "samples": len(texts),
        "mean_length": statistics.fmean(len(row) for row in ids) if ids else 0.0,
        **diversity_report(texts, ids),
    }


# Windows of held-out text per sample length: the bound's own sampling error is about
# 1/sqrt(HELD_OUT_WINDOWS) of held-out text's spread, small beside a set's.
HELD_OUT_WINDOWS = 128


class HeldOutText:
    """Held-out text as one token stream (EOS and padding dropped), read in windows of a
    sample's length: what the frontier's marks compare a sample set with (``bounds``)."""

    def __init__(self, stream: Sequence[int], decode: Callable[[list[int]], str]):
        if not stream:
            raise ValueError("held-out text is empty: there is nothing to bound the samples by")
        self.stream, self.decode = list(stream), decode
        self._stats: dict[int, tuple[float, float, float, float]] = {}

    def windows(self, length: int) -> list[list[int]]:
        """``HELD_OUT_WINDOWS`` windows of ``length`` tokens, evenly spaced over the stream."""
        length = min(length, len(self.stream))
        last = len(self.stream) - length
        starts = sorted(
            {round(i * last / max(HELD_OUT_WINDOWS - 1, 1)) for i in range(HELD_OUT_WINDOWS)}
        )
        return [self.stream[start : start + length] for start in starts]

    def stats(self, length: int) -> tuple[float, float, float, float]:
        """(mean, variance) of the unigram entropy and of the 4-gram repetition rate of
        held-out windows of ``length`` tokens (cached per length)."""
        if length not in self._stats:
            windows = self.windows(length)
            entropy = [unigram_entropy(w) for w in windows]
            repetition = [repetition_rate(self.decode(w)) for w in windows]
            self._stats[length] = (
                statistics.fmean(entropy),
                statistics.pvariance(entropy),
                statistics.fmean(repetition),
                statistics.pvariance(repetition),
            )
        return self._stats[length]

    def bounds(self, lengths: Sequence[int], set_size: int = 0) -> dict[str, float]:
        """What a set of samples of ``lengths`` must meet to be unmarked: held-out text of the
        same lengths has mean entropy (repetition) m, and a set of n such samples a standard
        error s; the floor is m - 1.96 s and the ceiling m + 1.96 s, so a set of n samples of
        held-out text passes each with probability 0.975. n is the set's size, or ``set_size``
        when that is larger: one n for every set of a report, so that no set's bound is widened
        by drawing fewer samples."""
        if not lengths:
            raise ValueError("no samples: a set needs at least one to be bounded")
        rows = [self.stats(length) for length in lengths]
        count = max(len(rows), set_size)
        entropy = statistics.fmean(row[0] for row in rows)
        repetition = statistics.fmean(row[2] for row in rows)
        entropy_se = math.sqrt(statistics.fmean(row[1] for row in rows) / count)
        repetition_se = math.sqrt(statistics.fmean(row[3] for row in rows) / count)
        return {
            "held_out_entropy": entropy,
            "entropy_floor": entropy - Z95 * entropy_se,
            "held_out_repetition": repetition,
            "repetition_ceiling": repetition + Z95 * repetition_se,
        }
