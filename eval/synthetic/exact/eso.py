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
the sampler feeds it), the true conditional of a language given as an explicit distribution
over rows (``conditional_predict``), which needs no order, or an absorbing family's exact
denoiser (``denoiser_predict``), the same truth with a completion for impossible evidence.
With the true conditional, alpha_0 = 0 (all left to right) and one position per diffusion step
are exact: the positive controls.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping

import torch
from torch import nn

from dllm.eso.objective import permuted_attention
from dllm.eso.sampler import EsoSamplerConfig, chunk_sizes
from eval.synthetic.exact.absorbing import candidates, draw_probs

Row = tuple[int, ...]
# (clean positions in the order they became clean, a batch of their tokens, the chunk's query
# positions) -> logits [batch, q, V] over the tokens (no [MASK] column)
Predict = Callable[[Row, list[Row], Row], torch.Tensor]


def chunk_moves(probs: torch.Tensor, min_prob: float = 0.0) -> dict[Row, float]:
    """Every joint draw of a chunk's tokens with its probability (independent draws); draws of
    probability <= ``min_prob`` left out (their mass is lost: q then sums to less than 1)."""
    options = candidates(probs, min_prob)
    return {
        tuple(token for token, _ in choice): math.prod(p for _, p in choice)
        for choice in itertools.product(*options)
    }


def walk_order(
    predict: Predict,
    config: EsoSamplerConfig,
    order: list[int],
    chunks: list[int],
    min_prob: float = 0.0,
) -> dict[Row, float]:
    """The tokens at ``order``'s positions (in that order) and their probability, for one order."""
    states: dict[Row, float] = {(): 1.0}
    done = 0
    for size in chunks:
        clean, queries = tuple(order[:done]), tuple(order[done : done + size])
        after: dict[Row, float] = defaultdict(float)
        # every state of this chunk shares its clean positions and queries: one batched call
        logits = predict(clean, list(states), queries)
        for (tokens, mass), state_logits in zip(states.items(), logits):
            probs = draw_probs(state_logits, config)
            for drawn, weight in chunk_moves(probs, min_prob).items():
                after[tokens + drawn] += mass * weight
        states, done = after, done + size
    return states


def eso_distribution(
    predict: Predict,
    config: EsoSamplerConfig,
    alpha_0: float,
    canvas: Row,
    mask_id: int,
    min_prob: float = 0.0,
) -> dict[Row, float]:
    """q over filled rows of the Eso sampler ``config`` from ``canvas`` (``alpha_0``: the
    model's; ``config.alpha_0`` wins); ``min_prob`` > 0 prunes draws (``chunk_moves``)."""
    config.validate()
    share = alpha_0 if config.alpha_0 is None else config.alpha_0
    masked = [i for i, token in enumerate(canvas) if token == mask_id]
    diffused = round(share * len(masked))
    chunks = chunk_sizes(diffused, config.steps) + [1] * (len(masked) - diffused)
    heads = list(itertools.permutations(masked, diffused))
    q: dict[Row, float] = defaultdict(float)
    for head in heads:
        order = [*head, *sorted(set(masked) - set(head))]
        for tokens, mass in walk_order(predict, config, order, chunks, min_prob).items():
            row = list(canvas)
            for position, token in zip(order, tokens):
                row[position] = token
            q[tuple(row)] += mass / len(heads)
    return dict(q)


def network_predict(model: nn.Module, canvas: Row, mask_id: int) -> Predict:
    """The trained network as the sampler runs it: causal over the fixed tokens (natural
    order), the clean ones in the order they became clean, then the chunk's [MASK] queries."""
    fixed = [i for i, token in enumerate(canvas) if token != mask_id]
    head = [canvas[i] for i in fixed]
    memo: dict[tuple[Row, tuple[Row, ...], Row], torch.Tensor] = {}  # orders share first chunks

    @torch.no_grad()
    def predict(clean: Row, batch: list[Row], queries: Row) -> torch.Tensor:
        key = (clean, tuple(batch), queries)
        if key not in memo:
            positions = torch.tensor([[*fixed, *clean, *queries]] * len(batch))
            inputs = [[*head, *tokens, *[mask_id] * len(queries)] for tokens in batch]
            attention = permuted_attention(model.config.sliding_window, positions)
            logits = model(torch.tensor(inputs), attention=attention, positions=positions)
            memo[key] = logits[:, -len(queries) :, :mask_id].double()
        return memo[key]

    return predict


def denoiser_predict(model: nn.Module, canvas: Row, mask_id: int) -> Predict:
    """An absorbing family's exact denoiser (``denoisers.ExactAbsorbing``) as the Eso sampler's
    predictor: the truth given the clean tokens does not depend on the order they became clean,
    and its completion answers where they are impossible."""

    @torch.no_grad()
    def predict(clean: Row, batch: list[Row], queries: Row) -> torch.Tensor:
        rows = [list(canvas) for _ in batch]
        for row, tokens in zip(rows, batch):
            for position, token in zip(clean, tokens):
                row[position] = token
        logits = model(torch.tensor(rows), attention="bidirectional")
        return logits[:, list(queries), :mask_id].double()

    return predict


def conditional_predict(language: Mapping[Row, float], canvas: Row, mask_id: int) -> Predict:
    """The true conditional of ``language`` (filled rows -> probability) at each query given
    the clean tokens, as logits (log-probabilities; impossible tokens at -inf)."""

    def predict(clean: Row, batch: list[Row], queries: Row) -> torch.Tensor:
        return torch.stack([one(clean, tokens, queries) for tokens in batch])

    def one(clean: Row, tokens: Row, queries: Row) -> torch.Tensor:
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
