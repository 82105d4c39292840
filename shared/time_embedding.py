"""The backbone's input vectors beyond the token lookup, both for uniform-state diffusion: the
diffusion time (``ModelConfig.time_conditioning``: a uniformly replaced token does not look like
noise, so the noise level is information the tokens alone do not carry) and soft tokens (the
Gaussian curriculum's relaxed inputs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class TimeEmbedding(nn.Module):
    """The diffusion time t in [0, 1] of each row as a vector added to every position's input
    embedding: sinusoidal features of 1000 t (the DiT / UDLM embedding of the noise level) through
    a two-layer MLP. The output layer starts at zero, so a conditioned model starts as the
    unconditioned one (and a run initialised from an unconditioned model starts where it was)."""

    features = 256

    def __init__(self, dim: int):
        super().__init__()
        self.hidden = nn.Linear(self.features, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.features // 2
        exponents = torch.arange(half, device=t.device, dtype=torch.float32) / half
        angles = 1000.0 * t.float()[:, None] * torch.exp(-math.log(10000.0) * exponents)[None]
        return self.out(F.silu(self.hidden(torch.cat([angles.cos(), angles.sin()], dim=-1))))

    def add_to(self, x: torch.Tensor, time: torch.Tensor | None) -> torch.Tensor:
        """``x`` [B, T, dim] with each row's time embedding added."""
        if time is None:
            raise ValueError(
                "this model is conditioned on the diffusion time (time_conditioning=true): "
                "pass time=[batch] in [0, 1]"
            )
        return x + self(time.to(x.device))[:, None, :].to(x.dtype)


@dataclass(frozen=True)
class SoftInput:
    """Soft tokens in place of hard ones at some positions (uniform-state diffusion's Gaussian
    curriculum): at each True of ``positions`` [B, T] (row-major order) the input is
    ``weights`` [n, K] (rows summing to one) times the embedding rows of token ``ids`` [K]."""

    positions: torch.Tensor
    weights: torch.Tensor
    ids: torch.Tensor


def embed_input(
    model: nn.Module, tokens: torch.Tensor, time: torch.Tensor | None, soft: SoftInput | None
) -> torch.Tensor:
    """The backbone's input vectors: token embeddings (soft ones where ``soft`` says), plus the
    time embedding of a time-conditioned model. The soft rows are computed inside the forward
    so that a compiled or sharded model sees them like any other input."""
    x = model.tok_embeddings(tokens)
    if soft is not None:
        table = model.tok_embeddings.weight[soft.ids.to(x.device)]
        x = x.clone()
        x[soft.positions] = (soft.weights.to(table.dtype) @ table).to(x.dtype)
    if model.config.time_conditioning:
        x = model.time_embedding.add_to(x, time)
    return x
