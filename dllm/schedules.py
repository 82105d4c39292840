"""Noise schedules of absorbing-state diffusion in continuous time, t in [0, 1].

alpha_t is the probability that a token is still clean at time t (alpha_0 = 1, alpha_1 = 0).
The NELBO weights the cross-entropy of masked tokens by -alpha'_t / (1 - alpha_t).
"""

from __future__ import annotations

import math

import torch


class LinearSchedule:
    """alpha_t = 1 - t; the loss weight is 1/t."""

    name = "linear"

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t

    def alpha_derivative(self, t: torch.Tensor) -> torch.Tensor:
        return -torch.ones_like(t)

    def loss_weight(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


class CosineSchedule:
    """alpha_t = cos(pi t / 2); the loss weight is (pi/2) sin(pi t/2) / (1 - cos(pi t/2))."""

    name = "cosine"

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cos(0.5 * math.pi * t)

    def alpha_derivative(self, t: torch.Tensor) -> torch.Tensor:
        return -0.5 * math.pi * torch.sin(0.5 * math.pi * t)

    def loss_weight(self, t: torch.Tensor) -> torch.Tensor:
        # 1 - cos(x) = 2 sin^2(x/2) avoids cancellation at small t.
        half = 0.25 * math.pi * t
        return 0.5 * math.pi * torch.sin(0.5 * math.pi * t) / (2.0 * torch.sin(half) ** 2)


SCHEDULES = {"linear": LinearSchedule, "cosine": CosineSchedule}


def get_schedule(name: str) -> LinearSchedule | CosineSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is unknown; valid schedules: {sorted(SCHEDULES)}")
    return SCHEDULES[name]()
