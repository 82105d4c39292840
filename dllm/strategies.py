"""Reveal rules: which masked positions of the current block get a token at each step.

A rule sees one step's ``StepContext`` (the still-masked positions of the block, the model's
predictions for them, the per-row random streams) and returns a boolean ``reveal`` mask plus the
proposed tokens. Everything else (blocks, caches, guidance, counting evaluations) belongs to the
sampling loop in ``dllm.sampler``, so a rule is a few lines of arithmetic:

- ``Ancestral``: the MDLM reverse process, exact for the model's schedule.
- ``FixedCount``: LLaDA's sampler, a scheduled number of tokens per step picked by a remasking
  rule (``low_confidence``, ``random``, ``margin``, ``entropy``).
- ``Threshold``: Fast-dLLM's parallel decoding, every position whose confidence passes a
  threshold (at least one per step).
- ``EntropyBounded``: the EB sampler, the largest most-confident set whose summed entropy
  minus its largest stays within gamma (at least one per step).

ReMDM (``dllm.remdm``), a rule that may also remask what it revealed, runs in the same loop.

Tokens are drawn from p_theta(x0 | x_t) after temperature / top-p (``shared.sampling``), in
float64 by inverse CDF, one CPU generator per row, so a row never depends on its batch mates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch

from dllm.schedules import get_schedule
from shared.sampling import SamplingConfig, process_logits, sample_categorical


@dataclass
class StepContext:
    """One step inside one block, for every row of the batch.

    ``masked`` [B, Lb]: block positions still masked. ``logits`` [B, Lb, V]: predictions over the
    real vocabulary (the [MASK] column already dropped, guidance already applied).
    ``index``: step within the block, ``steps``: steps per block (None for open-ended rules).
    ``masked_at_start`` [B]: how many block positions were masked when the block began.
    """

    index: int
    steps: int | None
    masked: torch.Tensor
    masked_at_start: torch.Tensor
    logits: torch.Tensor
    sampling: SamplingConfig
    generators: list[torch.Generator]
    confidence_dtype: torch.dtype = torch.float64  # float32 reproduces LLaDA's confidences
    # Block positions the sampler fills (masked when the block began), which a corrector may
    # remask, and what a rule keeps between the steps of one block (ReMDM's confidences).
    generated: torch.Tensor | None = None
    memory: dict = field(default_factory=dict)

    @cached_property
    def probs(self) -> torch.Tensor:
        """The model's own distribution (before temperature / top-p), float64 unless asked
        otherwise: what confidence is measured on, as in LLaDA and Fast-dLLM."""
        return torch.softmax(self.logits.to(self.confidence_dtype), dim=-1)

    def uniforms(self) -> torch.Tensor:
        """[B, Lb] float64 uniforms from each row's generator. A row draws Lb of them at every
        step where it still has masked positions in the block and nothing otherwise (its
        uniforms are then 1, which reveals nothing): its stream never depends on how many steps
        its batch mates need."""
        length = self.masked.shape[1]
        rows = [
            torch.rand(length, generator=g, dtype=torch.float64)
            if active
            else torch.ones(length, dtype=torch.float64)
            for g, active in zip(self.generators, self.masked.any(-1).tolist())
        ]
        return torch.stack(rows).to(self.masked.device)

    def draw_tokens(self, where: torch.Tensor) -> torch.Tensor:
        """[B, Lb] token draws at the positions in ``where`` (0 elsewhere) from the processed
        predictions; argmax when the temperature is 0."""
        tokens = torch.zeros_like(where, dtype=torch.long)
        if not where.any():
            return tokens
        processed = process_logits(self.logits[where], self.sampling)  # float64
        if self.sampling.greedy:
            tokens[where] = processed.argmax(-1)
            return tokens
        probs = torch.softmax(processed, dim=-1)
        per_row = torch.split(probs, where.sum(-1).tolist())
        draws = [sample_categorical(p, g) for p, g in zip(per_row, self.generators)]
        tokens[where] = torch.cat(draws)
        return tokens


# ---- the math, as small pure functions ---------------------------------------------------------


def step_times(index: int, steps: int) -> tuple[float, float]:
    """(t, s) of step ``index`` on the uniform grid from t=1 down to 0 in ``steps`` steps."""
    return 1.0 - index / steps, 1.0 - (index + 1) / steps


def unmask_probability(alpha_t: float, alpha_s: float) -> float:
    """Probability that a position masked at time t is revealed by the earlier time s:
    (alpha_s - alpha_t) / (1 - alpha_t). It is 1 when s = 0 (alpha_0 = 1)."""
    return (alpha_s - alpha_t) / (1.0 - alpha_t)


def reveal_counts(masked: torch.Tensor, steps: int, schedule: str = "linear") -> torch.Tensor:
    """[B, steps] tokens to reveal per step so that after step j a fraction alpha(1 - (j+1)/steps)
    of the ``masked`` [B] positions is revealed (rounded half up); the counts sum to ``masked``.
    The linear schedule spreads them evenly, as LLaDA does."""
    alpha = get_schedule(schedule).alpha
    times = 1.0 - torch.arange(steps + 1, dtype=torch.float64) / steps
    clean = alpha(times)
    clean[-1] = 1.0  # alpha_0 = 1 exactly, so the last step reveals whatever is left
    done = torch.floor(masked.double()[:, None] * clean[None, :] + 0.5).long()
    return done.diff(dim=-1).clamp(min=0)


def front_loaded_counts(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, steps] LLaDA's split of ``masked`` [B] positions over the steps: masked // steps each,
    and the remainder one more each to the first steps (e.g. 10 over 4 steps: 3, 3, 2, 2, where
    ``reveal_counts`` gives 3, 2, 3, 2)."""
    base = torch.div(masked, steps, rounding_mode="floor")
    remainder = masked - base * steps
    first = torch.arange(steps, device=masked.device)[None, :] < remainder[:, None]
    return base[:, None] + first.long()


def token_probability(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(token) at every position: LLaDA's "low_confidence" score."""
    return probs.gather(-1, tokens[..., None]).squeeze(-1)


def top2_margin(probs: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 probability: large when the model has one clear favourite."""
    top = probs.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def negative_entropy(probs: torch.Tensor) -> torch.Tensor:
    """sum p log p (0 log 0 = 0): higher means a more peaked, more confident prediction."""
    return torch.where(probs > 0, probs * probs.log(), torch.zeros_like(probs)).sum(-1)


def most_confident(scores: torch.Tensor, masked: torch.Tensor, counts: torch.Tensor):
    """Boolean [B, Lb]: the ``counts`` [B] highest-scoring masked positions of each row
    (ties go to the leftmost position: the sort is stable)."""
    # Masked positions always rank above the rest, even with the lowest possible score.
    lowest = torch.finfo(scores.dtype).min
    scores = torch.where(masked, scores.clamp(min=lowest), float("-inf"))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    positions = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    return (rank < counts[:, None]) & masked


def confident_or_best(scores: torch.Tensor, masked: torch.Tensor, threshold: float):
    """Boolean [B, Lb]: masked positions scoring >= threshold, plus each row's best masked
    position so that every row with work left makes progress."""
    passing = (scores >= threshold) & masked
    one = torch.ones(scores.shape[0], dtype=torch.long, device=scores.device)
    best = most_confident(scores, masked, one)
    return passing | best


# Remasking rules of LLaDA: how confident the model is at each masked position, given the tokens
# just drawn there. The most confident positions are revealed; the rest stay masked.
Score = Callable[[StepContext, torch.Tensor], torch.Tensor]
REMASKING: dict[str, Score] = {
    "low_confidence": lambda ctx, tokens: token_probability(ctx.probs, tokens),
    "random": lambda ctx, tokens: ctx.uniforms(),
    "margin": lambda ctx, tokens: top2_margin(ctx.probs),
    "entropy": lambda ctx, tokens: negative_entropy(ctx.probs),
}


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an integer >= 1")


def _steps_per_block(steps: int, n_blocks: int) -> int:
    if steps % n_blocks:
        raise ValueError(
            f"steps={steps} must be a multiple of the number of blocks ({n_blocks}): "
            "every block gets the same number of steps"
        )
    return steps // n_blocks


# ---- the rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ancestral:
    """MDLM's ancestral sampler: ``steps`` steps from t=1 to 0 under a noise schedule. From x_t
    to x_s every masked position is revealed with probability (alpha_s - alpha_t)/(1 - alpha_t),
    with a token drawn from p_theta(x0 | x_t); this is the model's exact reverse process, so the
    number revealed per step is random. ``schedule=None`` means the model's training schedule
    (``DiffusionGenerator`` reads it from the checkpoint; plain ``sample`` falls back to linear)."""

    steps: int
    schedule: str | None = None
    name: ClassVar[str] = "ancestral"

    def validate(self) -> Ancestral:
        _check_steps(self.steps)
        if self.schedule is not None:
            get_schedule(self.schedule)
        return self

    def steps_per_block(self, n_blocks: int) -> int | None:
        return _steps_per_block(self.steps, n_blocks)

    def step(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = get_schedule(self.schedule or "linear").alpha
        t, s = step_times(ctx.index, ctx.steps)
        p = unmask_probability(float(alpha(torch.tensor(t))), float(alpha(torch.tensor(s))))
        if s == 0.0:
            p = 1.0  # alpha_0 = 1: the last step reveals everything left
        # Decide which positions unmask first (independent of the predictions), then draw
        # tokens only there.
        reveal = ctx.masked & (ctx.uniforms() < p)
        return reveal, ctx.draw_tokens(reveal)


@dataclass(frozen=True)
class FixedCount:
    """LLaDA's sampler: ``steps`` steps per generation (split evenly across blocks); step j of a
    block reveals ``reveal_counts(...)[j]`` tokens, the most confident ones under ``remasking``.
    With ``steps`` equal to the number of masked tokens it reveals one token per step, and with
    ``remasking="random"`` that is exact sampling of the model's joint in a random order."""

    steps: int
    remasking: str = "low_confidence"
    schedule: str = "linear"
    # LLaDA's reference generate, reproduced: "front" gives each block's remainder to its first
    # steps (``front_loaded_counts``; linear only) instead of the rounded schedule, and
    # "float32" measures confidence on float32 probabilities, as LLaDA's does from float32
    # logits, instead of float64 (the order of near-ties can differ)
    split: str = "rounded"
    confidence: str = "float64"
    name: ClassVar[str] = "fixed"

    def validate(self) -> FixedCount:
        _check_steps(self.steps)
        if self.remasking not in REMASKING:
            raise ValueError(
                f"remasking={self.remasking!r} is unknown; valid rules: {sorted(REMASKING)}"
            )
        get_schedule(self.schedule)
        if self.split not in ("rounded", "front"):
            raise ValueError(f"split={self.split!r} must be 'rounded' or 'front' (LLaDA's)")
        if self.split == "front" and self.schedule != "linear":
            raise ValueError("split='front' is LLaDA's split of the linear schedule")
        if self.confidence not in ("float64", "float32"):
            raise ValueError(f"confidence={self.confidence!r} must be 'float64' or 'float32'")
        return self

    def steps_per_block(self, n_blocks: int) -> int | None:
        return _steps_per_block(self.steps, n_blocks)

    def step(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = ctx.draw_tokens(ctx.masked)
        if self.confidence == "float32":
            ctx = dataclasses.replace(ctx, confidence_dtype=torch.float32)
        scores = REMASKING[self.remasking](ctx, tokens)
        if self.split == "front":
            counts = front_loaded_counts(ctx.masked_at_start, ctx.steps)[:, ctx.index]
        else:
            counts = reveal_counts(ctx.masked_at_start, ctx.steps, self.schedule)[:, ctx.index]
        return most_confident(scores, ctx.masked, counts.to(scores.device)), tokens


@dataclass(frozen=True)
class Threshold:
    """Fast-dLLM's confidence-threshold parallel decoding: each step reveals every masked
    position of the block whose drawn token has model probability >= ``threshold``, and at least
    the single most confident one, until the block is full. The step count is open-ended (at
    most one per token)."""

    threshold: float = 0.9
    name: ClassVar[str] = "threshold"

    def validate(self) -> Threshold:
        # Written so that NaN fails too.
        if not (isinstance(self.threshold, int | float) and 0 < self.threshold <= 1):
            raise ValueError(f"threshold={self.threshold!r} must be in (0, 1]")
        return self

    def steps_per_block(self, n_blocks: int) -> int | None:
        return None

    def step(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = ctx.draw_tokens(ctx.masked)
        scores = token_probability(ctx.probs, tokens)
        return confident_or_best(scores, ctx.masked, self.threshold), tokens


def entropy_bounded_counts(scores: torch.Tensor, entropy: torch.Tensor, masked, gamma: float):
    """[B] the EB sampler's reveal counts: the size of the largest prefix U of the masked
    positions, most confident first, whose entropies satisfy sum_U H - max_U H <= gamma; at
    least one where anything is masked. The left side never falls as U grows (adding h raises
    the sum by h and the max by at most h), so the prefixes that pass are the first ones."""
    lowest = torch.finfo(scores.dtype).min
    ranked = torch.where(masked, scores.clamp(min=lowest), float("-inf"))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    sorted_entropy = entropy.gather(-1, order).to(torch.float64)
    sorted_masked = masked.gather(-1, order)
    spent = sorted_entropy.cumsum(-1) - sorted_entropy.cummax(-1).values
    within = (spent <= gamma) & sorted_masked
    return within.sum(-1).clamp(min=1) * masked.any(-1)


@dataclass(frozen=True)
class EntropyBounded:
    """The EB sampler (Ben-Hamu et al. 2025): each step orders the masked positions of the block
    by their prediction's confidence (its largest probability), draws a token at each, and
    reveals the largest most-confident set whose summed entropy minus its largest entropy stays
    within ``gamma`` (at least one). That sum bounds the dependence the independent draws
    ignore, so the set shares one error budget where the threshold sampler judges each token
    alone. The order is read from the predictions, not from the drawn tokens: which positions
    are revealed never depends on what was drawn there, so ``gamma = 0`` (one token per step,
    plus any certain ones) samples exactly from an exact denoiser, the positive control. The
    step count is open-ended (at most one per token)."""

    gamma: float = 0.01
    name: ClassVar[str] = "eb"

    def validate(self) -> EntropyBounded:
        # Written so that NaN fails too.
        if not (isinstance(self.gamma, int | float) and 0 <= self.gamma < float("inf")):
            raise ValueError(f"gamma={self.gamma!r} is out of range: valid gamma >= 0 (finite)")
        return self

    def steps_per_block(self, n_blocks: int) -> int | None:
        return None

    def step(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = ctx.draw_tokens(ctx.masked)
        scores = ctx.probs.amax(-1)
        entropy = -negative_entropy(ctx.probs)
        counts = entropy_bounded_counts(scores, entropy, ctx.masked, self.gamma)
        return most_confident(scores, ctx.masked, counts), tokens


Strategy = Ancestral | FixedCount | Threshold | EntropyBounded
STRATEGIES = {rule.name: rule for rule in (Ancestral, FixedCount, Threshold, EntropyBounded)}
