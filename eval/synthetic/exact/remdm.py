"""The exact steps of ReMDM (``dllm.remdm``) in one block: a Markov kernel over partial rows.

A ReMDM step moves every generated position of the block independently given the canvas: a
masked position is revealed with probability p = (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t),
its token drawn from the processed prediction, and stays masked otherwise; a revealed one is
remasked with probability sigma and kept otherwise. So the next canvas's distribution is the
outer product of one vector per position, and the step is a product kernel. Remasking means
canvases no longer move forward by the number revealed, so the program keeps, for every context
(the canvas outside the block), a dense array over the block's partial rows and applies the
kernel to each of them. The array's axes run over an alphabet of the ids met so far ([MASK], the
block's tokens, every id some draw gives mass to), which grows as the steps find new ids: a
byte tokenizer's 259 ids would make 259^Lb rows where a few of them ever occur.

The "conf" mode remasks by the confidence each token had when it was revealed, which is not in
the canvas: its state would need that history, and it is refused in one line.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from dllm.remdm import Remdm, reveal_probability
from shared.errors import ConfigError

Canvas = tuple[int, ...]
Predict = Callable[[Canvas, tuple[int, int]], torch.Tensor]  # canvas, block -> logits [Lb, V]
Draw = Callable[[torch.Tensor], torch.Tensor]  # logits [m, V] -> draw distributions [m, V]
DENSE_LIMIT = 200_000  # partial rows of one context (alphabet^Lb)


def check_exact_remdm(rule: Remdm) -> None:
    """Refuse, in one line, a ReMDM setting the program cannot follow."""
    if rule.mode == "conf":
        raise ConfigError(
            "remdm mode 'conf' is refused by the exact program: it remasks by each token's "
            "confidence when it was revealed, which the canvas does not hold; use constant, "
            "cap, rescale or loop"
        )


def check_rows(alphabet: int, block_length: int) -> None:
    if alphabet**block_length > DENSE_LIMIT:
        raise ConfigError(
            f"ReMDM's exact program would keep {alphabet}^{block_length} partial rows per "
            f"context, more than {DENSE_LIMIT}; use a smaller language or raise min_prob"
        )


def position_moves(
    tokens: tuple[int, ...],
    generated: list[bool],
    draws: torch.Tensor | None,
    chances: tuple[float, float, float],
    mask_id: int,
) -> list[dict[int, float]]:
    """Where each block position's token goes in this step (id -> probability). ``draws``
    [m, V]: the draw distributions of the masked positions in order, entries <= ``min_prob``
    left out (their mass is dropped); ``chances``: (reveal, sigma, min_prob)."""
    reveal, sigma, min_prob = chances
    moves, k = [], 0
    for token, free in zip(tokens, generated):
        if not free:  # a prompt or fixed token: never remasked
            moves.append({token: 1.0})
        elif token == mask_id:
            drawn = draws[k].tolist()
            move = {i: reveal * p for i, p in enumerate(drawn) if p > min_prob and i != mask_id}
            moves.append(move | {mask_id: 1.0 - reveal})
            k += 1
        else:
            moves.append({token: 1.0 - sigma, mask_id: sigma})
    return moves


def reindexed(rows: np.ndarray, old: tuple[int, ...], new: tuple[int, ...]) -> np.ndarray:
    """``rows`` over alphabet ``old`` moved onto the larger alphabet ``new``."""
    if old == new:
        return rows
    grown = np.zeros((len(new),) * rows.ndim)
    where = [new.index(i) for i in old]
    grown[np.ix_(*[where] * rows.ndim)] = rows
    return grown


def step_context(
    held: tuple[tuple[int, ...], np.ndarray],
    context: Canvas,
    model: tuple[Predict, Draw, Remdm],
    block: tuple[int, int],
    step: tuple[int, int, float, list[bool]],
    mask_id: int,
) -> tuple[tuple[tuple[int, ...], np.ndarray], float, float]:
    """One step of every partial row of a context (``held``: its alphabet and dense rows);
    returns the new alphabet and rows, the pruned mass and the mass that called the model."""
    (predict, draw, rule), (index, steps, min_prob, generated) = model, step
    alphabet, rows = held
    _, _, a_t, a_s = rule.alphas(index, steps)
    sigma = rule.step_sigma(index, steps)
    chances = (float(reveal_probability(a_t, a_s, sigma)), sigma, min_prob)
    start, end = block
    planned, calls = [], 0.0
    for position in zip(*np.nonzero(rows)):
        mass, tokens = float(rows[position]), tuple(alphabet[i] for i in position)
        masked = [i for i, t in enumerate(tokens) if t == mask_id and generated[i]]
        if not masked and not rule.remasks:  # the loop breaks out of a full block
            planned.append((mass, [{t: 1.0} for t in tokens]))
            continue
        calls += mass
        canvas = context[:start] + tokens + context[end:]
        draws = draw(predict(canvas, block)[masked]) if masked else None
        planned.append((mass, position_moves(tokens, generated, draws, chances, mask_id)))
    grown = tuple(sorted({*alphabet, *(i for _, ms in planned for m in ms for i in m)}))
    check_rows(len(grown), end - start)
    after, dropped = np.zeros((len(grown),) * (end - start)), 0.0
    for mass, moves in planned:
        vectors = [np.zeros(len(grown)) for _ in moves]
        for vector, move in zip(vectors, moves):
            for token, chance in move.items():
                vector[grown.index(token)] = chance
        moved = functools.reduce(np.multiply.outer, vectors)
        dropped += mass * (1.0 - float(moved.sum()))
        after += mass * moved
    return (grown, after), dropped, calls


def remdm_block(
    states: dict[Canvas, float],
    model: tuple[Predict, Draw, Remdm],
    layout_canvas: Canvas,
    mask_id: int,
    block: tuple[int, int],
    steps: int,
    min_prob: float,
) -> tuple[dict[Canvas, float], float, float]:
    """Every step of ReMDM in ``block`` (``model``: the predictor, the draw distributions of
    its logits and the rule): (canvases, pruned mass, expected model calls)."""
    start, end = block
    check_exact_remdm(model[2])
    generated = [t == mask_id for t in layout_canvas[start:end]]
    alphabet = tuple(sorted({mask_id, *(t for c in states for t in c[start:end])}))
    check_rows(len(alphabet), end - start)
    contexts: dict[Canvas, tuple[tuple[int, ...], np.ndarray]] = {}
    for canvas, mass in states.items():
        context = canvas[:start] + (mask_id,) * (end - start) + canvas[end:]
        held = contexts.setdefault(context, (alphabet, np.zeros((len(alphabet),) * (end - start))))
        held[1][tuple(alphabet.index(t) for t in canvas[start:end])] += mass
    dropped = calls = 0.0
    for index in range(steps):
        for context, held in contexts.items():
            step = (index, steps, min_prob, generated)
            contexts[context], lost, called = step_context(
                held, context, model, block, step, mask_id
            )
            dropped, calls = dropped + lost, calls + called
    after: dict[Canvas, float] = defaultdict(float)
    for context, (alphabet, rows) in contexts.items():
        for position in zip(*np.nonzero(rows)):
            tokens = tuple(alphabet[i] for i in position)
            after[context[:start] + tokens + context[end:]] += float(rows[position])
    return dict(after), dropped, calls
