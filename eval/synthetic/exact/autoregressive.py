"""The exact output distribution of AR decoding (``arlm.decoding``) from ``[BOS]``, by the chain
rule over prefixes: each step draws from the processed next-token distribution (temperature,
top-k, top-p, min-p, repetition penalty over BOS and the tokens so far: ``shared.sampling``; plain
greedy is the argmax of the raw logits, as ``choose_tokens`` does), a row stops at EOS or after
``max_new_tokens``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from shared.sampling import SamplingConfig, process_logits

Prefix = tuple[int, ...]


def next_token_probs(
    logits: torch.Tensor, prefix: Prefix, sampling: SamplingConfig
) -> torch.Tensor:
    """[V] float64: the distribution the next token is drawn from after ``prefix`` (BOS first)."""
    if sampling.greedy and sampling.repetition_penalty == 1.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    seen = None
    if sampling.repetition_penalty != 1.0:
        seen = torch.zeros(logits.shape[-1], dtype=torch.bool)
        seen[list(prefix)] = True
    processed = process_logits(logits, sampling, seen)
    if sampling.greedy:
        return torch.nn.functional.one_hot(processed.argmax(-1), logits.shape[-1]).double()
    return torch.softmax(processed, dim=-1)


def ar_distribution(
    logits_after: Callable[[Prefix], torch.Tensor],
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
    sampling: SamplingConfig,
    decode: Callable[[Sequence[int]], str | None],
    min_prob: float = 0.0,
) -> tuple[dict[str | None, float], float]:
    """(q over samples, pruned probability): every prefix's probability, extended one token per
    step until EOS or ``max_new_tokens``; tokens drawn with probability <= ``min_prob`` are
    pruned (0: none is, the distribution is exact)."""
    states: dict[Prefix, float] = {(bos_id,): 1.0}
    samples: dict[str | None, float] = defaultdict(float)
    dropped = 0.0
    for _ in range(max_new_tokens):
        after: dict[Prefix, float] = defaultdict(float)
        for prefix, mass in states.items():
            probs = next_token_probs(logits_after(prefix), prefix, sampling)
            kept = torch.nonzero(probs > min_prob).flatten().tolist()
            dropped += mass * (1.0 - float(probs[kept].sum()))
            for token in kept:
                weight = mass * float(probs[token])
                if token == eos_id:
                    samples[decode(prefix[1:])] += weight
                else:
                    after[prefix + (token,)] += weight
        states = after
    for prefix, mass in states.items():  # stopped by the length limit
        samples[decode(prefix[1:])] += mass
    return dict(samples), dropped
