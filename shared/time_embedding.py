"""The diffusion time as an input to the backbone (``ModelConfig.time_conditioning``, used by
uniform-state diffusion): a uniformly replaced token does not look like noise, so the noise level
is information the tokens alone do not carry."""

from __future__ import annotations

import math

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
