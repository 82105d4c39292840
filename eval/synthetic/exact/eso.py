"""The exact output distribution of the Eso-LM sampler (``dllm.eso.sampler``) on a canvas with
``[MASK]`` at the positions to generate, by enumeration.

The sampler draws a uniformly random order of the n positions; the diffusion phase reveals the
first d = round(alpha_0 n) in chunks (``chunk_sizes``), each token of a chunk drawn
independently from its own prediction, and the autoregressive phase the other n - d in
ascending order, one at a time. The process depends on the order only through its first d
positions (the rest are sorted), so q averages over the n! / (n - d)! ordered heads, each
walked through its chunks with every joint draw of a chunk enumerated:

    q(x) = mean over heads h of prod over chunks c of prod over i in c of P(x_i | what is clean)

``Predict`` gives the logits the sampler would draw from: the trained network over the clean
tokens in the order they became clean and the chunk's [MASK] queries (``network_predict``, as
the sampler feeds it), or the true conditional of a language given as an explicit distribution
over rows (``conditional_predict``), which needs no order. With the true conditional, alpha_0 = 0
(all left to right) and one position per diffusion step are exact: the positive controls.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping

import torch
from torch import nn

from dllm.eso.sampler import EsoSamplerConfig, chunk_sizes
from eval.synthetic.exact.absorbing import draw_probs

Row = tuple[int, ...]
# (clean positions in the order they became clean, their tokens, the chunk's query positions)
# -> logits [q, V] over the tokens (no [MASK] column)
Predict = Callable[[Row, Row, Row], torch.Tensor]


def chunk_moves(probs: torch.Tensor) -> dict[Row, float]:
    """Every joint draw of a chunk's tokens with its probability (independent draws)."""
    options = [[(int(t), float(row[t])) for t in torch.nonzero(row).flatten()] for row in probs]
    return {
        tuple(token for token, _ in choice): math.prod(p for _, p in choice)
        for choice in itertools.product(*options)
    }


def walk_order(
    predict: Predict, config: EsoSamplerConfig, order: list[int], chunks: list[int]
) -> dict[Row, float]:
    """The tokens at ``order``'s positions (in that order) and their probability, for one order."""
    states: dict[Row, float] = {(): 1.0}
    done = 0
    for size in chunks:
        clean, queries = tuple(order[:done]), tuple(order[done : done + size])
        after: dict[Row, float] = defaultdict(float)
        for tokens, mass in states.items():
            for drawn, weight in chunk_moves(
                draw_probs(predict(clean, tokens, queries), config)
            ).items():
                after[tokens + drawn] += mass * weight
        states, done = after, done + size
    return states


def eso_distribution(
    predict: Predict, config: EsoSamplerConfig, alpha_0: float, canvas: Row, mask_id: int
) -> dict[Row, float]:
    """q over filled rows of the Eso sampler ``config`` from ``canvas`` (``alpha_0``: the
    model's; ``config.alpha_0`` wins)."""
    config.validate()
    share = alpha_0 if config.alpha_0 is None else config.alpha_0
    masked = [i for i, token in enumerate(canvas) if token == mask_id]
    diffused = round(share * len(masked))
    chunks = chunk_sizes(diffused, config.steps) + [1] * (len(masked) - diffused)
    heads = list(itertools.permutations(masked, diffused))
    q: dict[Row, float] = defaultdict(float)
    for head in heads:
        order = [*head, *sorted(set(masked) - set(head))]
        for tokens, mass in walk_order(predict, config, order, chunks).items():
            row = list(canvas)
            for position, token in zip(order, tokens):
                row[position] = token
            q[tuple(row)] += mass / len(heads)
    return dict(q)


def network_predict(model: nn.Module, canvas: Row, mask_id: int) -> Predict:
    """The trained network as the sampler runs it: causal over the fixed tokens (natural
    order), the clean ones in the order they became clean, then the chunk's [MASK] queries."""
    fixed = [i for i, token in enumerate(canvas) if token != mask_id]

    @torch.no_grad()
    def predict(clean: Row, tokens: Row, queries: Row) -> torch.Tensor:
        positions = [*fixed, *clean, *queries]
        inputs = [*(canvas[i] for i in fixed), *tokens, *[mask_id] * len(queries)]
        logits = model(
            torch.tensor([inputs]), attention="causal", positions=torch.tensor([positions])
        )
        return logits[0, -len(queries) :, :mask_id].double()

    return predict


def conditional_predict(language: Mapping[Row, float], canvas: Row, mask_id: int) -> Predict:
    """The true conditional of ``language`` (filled rows -> probability) at each query given
    the clean tokens, as logits (log-probabilities; impossible tokens at -inf)."""

    def predict(clean: Row, tokens: Row, queries: Row) -> torch.Tensor:
        consistent = [
            (row, p)
            for row, p in language.items()
            if all(row[i] == t for i, t in zip(clean, tokens))
            and all(row[i] == t for i, t in enumerate(canvas) if t != mask_id)
        ]
        if not consistent:
            raise ValueError(f"no row of the language holds {dict(zip(clean, tokens))}")
        probs = torch.zeros(len(queries), mask_id, dtype=torch.float64)
        for row, p in consistent:
            for k, position in enumerate(queries):
                probs[k, row[position]] += p
        return torch.log(probs / probs.sum(-1, keepdim=True))

    return predict
