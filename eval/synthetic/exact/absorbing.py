"""The exact output distribution of the masked and block samplers (``dllm.sampler.run``) on an
unconditional canvas ``[BOS] + [MASK] * gen_length``, by dynamic programming over partial rows.

The DP walks the loop's own structure: blocks left to right, ``steps`` steps per block (until the
block is full for ``Threshold``), and keeps the probability of every canvas. A step of a canvas
mirrors the rule (``dllm.strategies``):

- every masked position of the block draws a token from the processed predictions (temperature,
  top-k/top-p: ``StepContext.draw_tokens``), independently;
- ``Ancestral`` reveals each masked position with probability (alpha_s - alpha_t)/(1 - alpha_t);
  ``FixedCount`` reveals the ``reveal_counts`` (or ``front_loaded_counts``) of that step: a
  uniformly random subset for "random", the ``most_confident`` positions (stable: ties to the
  left) for the others, scored on the unprocessed probabilities; ``Threshold`` reveals every
  drawn token whose probability passes, else the most confident one (``confident_or_best``);
  ``EntropyBounded`` reveals its entropy-budget set of the most confident predictions.

Where the reveal depends on the drawn tokens (low_confidence, threshold), the DP enumerates the
joint draws of the masked positions and runs the rule's own functions on them as a batch. A
canvas is final once a finished block holds an EOS (later blocks cannot change what is before it;
the block sampler stops there too) or every block is done. Predictions come from the family's own
exact predictor (``FullForward``, ``BlockCausalForward``), one canvas at a time.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm.remdm import Remdm
from dllm.sampler import SamplerConfig
from dllm.schedules import get_schedule
from dllm.strategies import (
    Ancestral,
    EntropyBounded,
    FixedCount,
    Threshold,
    confident_or_best,
    entropy_bounded_counts,
    front_loaded_counts,
    most_confident,
    negative_entropy,
    reveal_counts,
    step_times,
    top2_margin,
    unmask_probability,
)
from eval.synthetic.exact.remdm import remdm_block
from shared.errors import ConfigError
from shared.sampling import process_logits

Canvas = tuple[int, ...]
Moves = dict[tuple[tuple[int, ...], tuple[int, ...]], float]  # (positions, tokens) -> probability
JOINT_DRAW_LIMIT = 100_000


def draw_probs(logits: torch.Tensor, config: SamplerConfig) -> torch.Tensor:
    """[m, V] float64: the distribution each masked position's token is drawn from (only
    ``config.sampling`` is read, so any sampler settings that carry one will do)."""
    processed = process_logits(logits, config.sampling)
    if config.sampling.greedy:
        return torch.nn.functional.one_hot(processed.argmax(-1), processed.shape[-1]).double()
    return torch.softmax(processed, dim=-1)


def candidates(draws: torch.Tensor, min_prob: float) -> list[list[tuple[int, float]]]:
    """Per masked position, the tokens it may draw (probability > ``min_prob``)."""
    return [
        [(int(t), float(row[t])) for t in torch.nonzero(row > min_prob).flatten()] for row in draws
    ]


def independent_moves(
    subsets: list[tuple[tuple[int, ...], float]], options: list[list[tuple[int, float]]]
) -> Moves:
    """Reveal sets chosen independently of the draws: each with its probability, and the tokens
    at its positions drawn independently."""
    moves: Moves = defaultdict(float)
    for positions, weight in subsets:
        for choice in itertools.product(*(options[i] for i in positions)):
            tokens = tuple(token for token, _ in choice)
            moves[(positions, tokens)] += weight * math.prod(p for _, p in choice)
    return moves


def joint_moves(
    options: list[list[tuple[int, float]]],
    reveal_of: Callable[[torch.Tensor], torch.Tensor],
) -> Moves:
    """Reveal sets that depend on the draws: enumerate every joint draw of the masked positions,
    let ``reveal_of`` (tokens [N, m] -> reveal [N, m]) pick, and add up by outcome."""
    count = math.prod(len(o) for o in options)
    if count > JOINT_DRAW_LIMIT:
        raise ConfigError(
            f"a step has {count} joint draws to enumerate, more than {JOINT_DRAW_LIMIT}; use a "
            "smaller language or raise min_prob (it prunes unlikely tokens and reports their mass)"
        )
    combos = list(itertools.product(*options))
    tokens = torch.tensor([[t for t, _ in c] for c in combos], dtype=torch.long)
    weights = [math.prod(p for _, p in c) for c in combos]
    reveal = reveal_of(tokens)
    moves: Moves = defaultdict(float)
    for row, picked, weight in zip(tokens.tolist(), reveal.tolist(), weights):
        positions = tuple(i for i, on in enumerate(picked) if on)
        moves[(positions, tuple(row[i] for i in positions))] += weight
    return moves


@dataclass(frozen=True)
class Step:
    """Where a step stands: its index in the block, the block's steps (None: open-ended), the
    block's masked count when it began, and the draw probability at or below which a token is
    pruned (0: nothing is, the DP is exact)."""

    index: int
    steps: int | None
    at_start: int
    min_prob: float = 0.0


def rule_moves(config: SamplerConfig, logits: torch.Tensor, step: Step) -> tuple[Moves, float]:
    """The moves of one step on the m masked positions of a block (``logits`` [m, V]), as
    (positions among the masked ones, tokens) -> probability, and the pruned probability."""
    rule, m = config.strategy, logits.shape[0]
    draws = draw_probs(logits, config)
    options = candidates(draws, step.min_prob)
    kept = math.prod(sum(p for _, p in o) for o in options)
    dtype = torch.float32 if getattr(rule, "confidence", "") == "float32" else torch.float64
    probs = torch.softmax(logits.to(dtype), dim=-1)
    everywhere = torch.ones(1, m, dtype=torch.bool)
    if isinstance(rule, Ancestral):
        alpha = get_schedule(rule.schedule or "linear").alpha
        t, s = step_times(step.index, step.steps)
        p = unmask_probability(float(alpha(torch.tensor(t))), float(alpha(torch.tensor(s))))
        p = 1.0 if s == 0.0 else p
        subsets = [
            (tuple(i for i in range(m) if bits[i]), math.prod(p if b else 1 - p for b in bits))
            for bits in itertools.product((0, 1), repeat=m)
        ]
        return independent_moves(subsets, options), 1 - kept
    if isinstance(rule, Threshold):

        def reveal_of(tokens: torch.Tensor) -> torch.Tensor:
            scores = probs.gather(-1, tokens.T).T
            return confident_or_best(scores, everywhere.expand_as(tokens), rule.threshold)

        return joint_moves(options, reveal_of), 1 - kept
    if isinstance(rule, EntropyBounded):  # the set depends on the predictions only
        scores, entropy = probs.amax(-1)[None], -negative_entropy(probs)[None]
        counts = entropy_bounded_counts(scores, entropy, everywhere, rule.gamma)
        picked = most_confident(scores, everywhere, counts)[0]
        positions = tuple(i for i in range(m) if picked[i])
        return independent_moves([(positions, 1.0)], options), 1 - kept
    count = reveal_count(rule, step.index, step.steps, step.at_start)
    return fixed_count_moves(rule, probs, options, count), 1 - kept


def reveal_count(rule: FixedCount, index: int, steps: int, at_start: int) -> int:
    start = torch.tensor([at_start])
    if rule.split == "front":
        return int(front_loaded_counts(start, steps)[0, index])
    return int(reveal_counts(start, steps, rule.schedule)[0, index])


def fixed_count_moves(
    rule: FixedCount,
    probs: torch.Tensor,
    options: list[list[tuple[int, float]]],
    reveal: int,
) -> Moves:
    """FixedCount's step: its count of the most confident positions under its remasking rule."""
    m = probs.shape[0]
    count = torch.tensor([reveal])
    everywhere = torch.ones(1, m, dtype=torch.bool)
    if rule.remasking == "random":  # i.i.d. uniform scores: a uniformly random subset
        size = min(int(count), m)
        subsets = list(itertools.combinations(range(m), size))
        return independent_moves([(s, 1.0 / len(subsets)) for s in subsets], options)
    if rule.remasking in ("margin", "entropy"):  # scores do not depend on the draws
        scores = top2_margin(probs) if rule.remasking == "margin" else negative_entropy(probs)
        picked = most_confident(scores[None], everywhere, count)[0]
        positions = tuple(i for i in range(m) if picked[i])
        return independent_moves([(positions, 1.0)], options)

    def reveal_of(tokens: torch.Tensor) -> torch.Tensor:
        scores = probs.gather(-1, tokens.T).T
        return most_confident(scores, everywhere.expand_as(tokens), count.expand(len(tokens)))

    return joint_moves(options, reveal_of)


Predict = Callable[[Canvas, tuple[int, int]], torch.Tensor]  # canvas, block -> logits [Lb, V]


@dataclass(frozen=True)
class Layout:
    """The canvas, its blocks, the [MASK] and EOS ids, where the generation region starts (a
    block of the training grid may begin at BOS) and how a finished canvas reads."""

    canvas: Canvas
    blocks: list[tuple[int, int]]
    mask_id: int
    eos_id: int
    region_start: int
    decode: Callable[[Canvas], str | None]
    # whether some row of the language holds a canvas's tokens (None: not asked)
    possible: Callable[[Canvas], bool] | None = None


def step_canvases(
    states: dict[Canvas, float],
    predict: Predict,
    config: SamplerConfig,
    layout: Layout,
    block: tuple[int, int],
    step: Step,
) -> tuple[dict[Canvas, float], float]:
    """One step of every canvas in ``block``; returns the new canvases and the pruned mass."""
    start, end = block
    after: dict[Canvas, float] = defaultdict(float)
    dropped = 0.0
    for canvas, mass in states.items():
        masked = [i for i in range(start, end) if canvas[i] == layout.mask_id]
        if not masked:  # the loop breaks out of a full block
            after[canvas] += mass
            continue
        logits = predict(canvas, block)[[i - start for i in masked]]
        moves, pruned = rule_moves(config, logits, step)
        dropped += mass * pruned
        for (positions, tokens), weight in moves.items():
            row = list(canvas)
            for position, token in zip(positions, tokens):
                row[masked[position]] = token
            after[tuple(row)] += mass * weight
    return after, dropped


@dataclass(frozen=True)
class Absorbing:
    """What the program gives: q over samples, the pruned probability, the impossible mass (None
    without ``layout.possible``) and the expected number of model calls of one row."""

    samples: dict[str | None, float]
    dropped: float
    impossible: float | None
    calls: float


def block_steps(
    states: dict[Canvas, float],
    predict: Predict,
    config: SamplerConfig,
    layout: Layout,
    block: tuple[int, int],
    min_prob: float,
) -> tuple[dict[Canvas, float], float, float]:
    """Every step of one block: (canvases, pruned mass, expected model calls)."""
    start, end = block
    steps = config.strategy.steps_per_block(len(layout.blocks))
    if isinstance(config.strategy, Remdm):
        model = (predict, lambda logits: draw_probs(logits, config), config.strategy)
        return remdm_block(states, model, layout.canvas, layout.mask_id, block, steps, min_prob)
    at_start = sum(t == layout.mask_id for t in layout.canvas[start:end])
    index, dropped, calls = 0, 0.0, 0.0
    while steps is None or index < steps:
        active = [m for c, m in states.items() if layout.mask_id in c[start:end]]
        if not active:
            break
        calls += sum(active)  # a canvas with nothing masked in the block calls no model
        step = Step(index, steps, at_start, min_prob)
        states, pruned = step_canvases(states, predict, config, layout, block, step)
        dropped += pruned
        index += 1
    return states, dropped, calls


def absorbing_distribution(
    predict: Predict, config: SamplerConfig, layout: Layout, min_prob: float = 0.0
) -> Absorbing:
    """q of the sampler ``config`` from ``layout.canvas`` (``Absorbing``). The impossible mass
    is the probability of ending on a canvas no row holds: without a corrector revealed tokens
    stay, so a path that reaches an impossible canvas ends on one and this is the mass that ever
    reaches one; ReMDM may remask its way out, and it is the mass that ends on one."""
    states: dict[Canvas, float] = {layout.canvas: 1.0}
    samples: dict[str | None, float] = defaultdict(float)
    finals: dict[Canvas, float] = {}  # canvases whose sample is fixed
    dropped = calls = 0.0
    for start, end in layout.blocks:
        states, pruned, called = block_steps(
            states, predict, config, layout, (start, end), min_prob
        )
        dropped, calls = dropped + pruned, calls + called
        # a finished block holding an EOS fixes the sample: later blocks come after it
        for canvas in [c for c in states if layout.eos_id in c[layout.region_start : end]]:
            finals[canvas] = states.pop(canvas)
    finals.update(states)
    for canvas, mass in finals.items():
        samples[layout.decode(canvas)] += mass
    impossible = None
    if layout.possible is not None:
        impossible = sum(mass for canvas, mass in finals.items() if not layout.possible(canvas))
    return Absorbing(dict(samples), dropped, impossible, calls)
