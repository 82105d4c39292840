"""Turning logits into token draws: the decoding controls shared by AR and diffusion samplers.

Every function is pure and works on the last dimension of a logits tensor [..., V]. Draws happen in
float64: in float32, Gumbel noise and small probabilities are truncated, which silently lowers the
sampling temperature and the entropy of the samples (and flatters generative perplexity).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding controls; the defaults leave the model's distribution untouched.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of most likely tokens whose probability reaches top_p (1 = off).
    min_p: drop tokens whose probability is below min_p x the top token's (0 = off).
    repetition_penalty: > 1 discourages tokens already present (1 = off); positive logits are
        divided by it and negative ones multiplied, as common LLM APIs do.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def validate(self) -> SamplingConfig:
        if not (self.temperature >= 0):
            raise ValueError(f"temperature={self.temperature!r} must be >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be a non-negative integer (0 = off)")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1] (1 = off)")
        if not (0 <= self.min_p <= 1):
            raise ValueError(f"min_p={self.min_p!r} must be in [0, 1] (0 = off)")
        if not (self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty={self.repetition_penalty!r} must be > 0 (1 = off)"
            )
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """Penalise tokens marked in ``seen`` [..., V] (bool): positive logits / penalty, negative
    logits x penalty, so the token always becomes less likely when penalty > 1."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties at the boundary are kept), set the rest to -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the most likely tokens until their total probability reaches p
    (the token that crosses p is kept, so at least one token always survives)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.double(), dim=-1)
    mass_before = probs.cumsum(-1) - probs  # probability of strictly more likely tokens
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's."""
    if min_p <= 0:
        return logits
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    threshold = log_probs.max(dim=-1, keepdim=True).values + torch.log(
        torch.tensor(min_p, dtype=torch.float64)
    )
    return logits.masked_fill(log_probs < threshold, float("-inf"))


def process_logits(
    logits: torch.Tensor, config: SamplingConfig, seen: torch.Tensor | None = None
) -> torch.Tensor:
    """Repetition penalty, temperature, then top-k, top-p and min-p; returns float64 logits."""
    logits = logits.double()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, config.repetition_penalty)
    if not config.greedy:
        logits = logits / config.temperature
    logits = top_k_filter(logits, config.top_k)
    logits = top_p_filter(logits, config.top_p)
    return min_p_filter(logits, config.min_p)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs`` [..., V] by inverse CDF in float64 (probabilities need not
    be normalised). Uniforms come from ``generator`` on the CPU, so a seed gives the same draw on
    any device."""
    probs = probs.double()
    cdf = probs.cumsum(-1)
    uniforms = torch.rand(cdf.shape[:-1] + (1,), generator=generator, dtype=torch.float64)
    uniforms = uniforms.to(cdf.device) * cdf[..., -1:]
    index = torch.searchsorted(cdf, uniforms, right=True).clamp(max=probs.shape[-1] - 1)
    return index.squeeze(-1)


def sample_from_logits(
    logits: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token ids [...] drawn from ``logits`` [..., V] under ``config`` (argmax when greedy)."""
    processed = process_logits(logits, config, seen)
    if config.greedy:
        return processed.argmax(dim=-1)
    return sample_categorical(torch.softmax(processed, dim=-1), generator)
