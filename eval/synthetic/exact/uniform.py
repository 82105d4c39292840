"""The exact output distribution of the uniform-state sampler (``dllm.uniform.sampler``) as a
Markov chain over whole rows.

z_1 is uniform over the N support ids at every free position; step k of ``steps`` (t = k/steps to
s = (k-1)/steps) moves each free position independently given the row, by the sampler's own
``corrected_step`` (the ancestral posterior for kappa = 1, Duo++'s Psi step otherwise) on the
processed x_theta, or to the argmax (temperature 0, or the greedy tail at the last step).

Rows are tracked over ``classes``: token ids each tracked on their own, plus, when they do not
cover the support, one ``other`` class of the remaining ids, represented by one of them. That
lumping is exact when the model treats every id of the other class alike (the exact denoiser
does: none of them is a symbol of any row); a trained network must have all N ids as classes.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from dllm.uniform.objective import support_ids, support_index
from dllm.uniform.sampler import UniformSamplerConfig, corrected_step, psi_plan
from shared.sampling import process_logits

Row = tuple[int, ...]  # class indices of the free positions


@dataclass(frozen=True)
class Classes:
    """``ids``: the tracked token ids; ``other``: the id that stands for every remaining support
    id (None when ``ids`` cover the support); ``n_support``; ``pad_id`` (outside the support)."""

    ids: tuple[int, ...]
    other: int | None
    n_support: int
    pad_id: int

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.ids if self.other is None else (*self.ids, self.other)

    def prior(self) -> np.ndarray:
        """z_1's class probabilities: uniform over the support."""
        probs = np.full(len(self.tokens), 1.0 / self.n_support)
        if self.other is not None:
            probs[-1] = (self.n_support - len(self.ids)) / self.n_support
        return probs

    def lump(self, support_probs: torch.Tensor) -> np.ndarray:
        """[n, N] probabilities over the support -> [n, classes]."""
        probs = support_probs.double().cpu().numpy()
        columns = support_index(torch.tensor(self.ids), self.pad_id).numpy()
        tracked = probs[:, columns]
        if self.other is None:
            return tracked
        return np.concatenate([tracked, 1.0 - tracked.sum(1, keepdims=True)], axis=1)


Logits = Callable[[Row, float], torch.Tensor]  # row of classes, t -> logits [G, N] (support)


@functools.lru_cache(maxsize=16)
def step_plan(config: UniformSamplerConfig) -> tuple[tuple[float, float, float], ...]:
    """``psi_plan`` once per sampler setting (every row of every step reads it)."""
    return tuple(psi_plan(config))


def step_probs(
    logits: torch.Tensor, row: Row, classes: Classes, config: UniformSamplerConfig, k: int
) -> np.ndarray:
    """[G, classes]: each free position's next class given the row, at step k (counted down
    from ``steps``; its times and kappa from ``psi_plan``)."""
    t, s, kappa = step_plan(config)[config.steps - k]
    processed = process_logits(logits, config.sampling)
    if config.sampling.greedy or (k == 1 and config.greedy_tail):
        chosen = processed.argmax(-1)
        return classes.lump(torch.nn.functional.one_hot(chosen, logits.shape[-1]))
    x_theta = torch.softmax(processed, dim=-1)
    current = torch.tensor([classes.tokens[c] for c in row])
    noised = support_index(current, classes.pad_id)
    return classes.lump(corrected_step(x_theta, noised, t, s, kappa))


def product_distribution(per_position: np.ndarray) -> np.ndarray:
    """The joint of independent positions [G, C] as an array of shape [C] * G."""
    joint = np.ones(())
    for probs in per_position:
        joint = np.multiply.outer(joint, probs)
    return joint


def uniform_distribution(
    logits_of: Logits,
    classes: Classes,
    config: UniformSamplerConfig,
    gen_length: int,
    decode: Callable[[Row], str | None],
) -> dict[str | None, float]:
    """q over samples of ``config`` from z_1 on ``gen_length`` free positions."""
    config.validate()
    dist = product_distribution(np.tile(classes.prior(), (gen_length, 1)))
    for k in range(config.steps, 0, -1):
        after = np.zeros_like(dist)
        for row in zip(*np.nonzero(dist)):
            row = tuple(int(c) for c in row)
            time = step_plan(config)[config.steps - k][0]
            probs = step_probs(logits_of(row, time), row, classes, config, k)
            after += dist[row] * product_distribution(np.clip(probs, 0.0, None))
        dist = after
    samples: dict[str | None, float] = defaultdict(float)
    for row in zip(*np.nonzero(dist)):
        samples[decode(tuple(int(c) for c in row))] += float(dist[row])
    return dict(samples)


def full_support(n_support: int, pad_id: int) -> Classes:
    """Every support id a class of its own (what a trained network needs)."""
    ids = support_ids(torch.arange(n_support), pad_id).tolist()
    return Classes(tuple(ids), None, n_support, pad_id)
