"""Rotary position embeddings (RoPE, Su et al. 2021): the inverse frequencies, Llama-3's
long-context rescaling of them, the cos/sin tables and the rotation of query and key channels."""

from __future__ import annotations

import math

import torch

from shared.config import ModelConfig
from shared.ops import RotaryFunction, rotate_pairs


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, one per channel pair: theta^(-2i/head_dim)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def llama3_scaled_frequencies(
    frequencies: torch.Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_len: int,
) -> torch.Tensor:
    """Llama-3's long-context rescaling of RoPE inverse frequencies.

    Wavelengths (2 pi / frequency) shorter than original_max_len / high_freq_factor are kept,
    those longer than original_max_len / low_freq_factor are stretched by ``factor``, and the
    band between blends the two linearly in original_max_len / wavelength, so the short-range
    channels that resolve nearby tokens stay as trained while the long-range ones reach further.
    """
    wavelength = 2 * math.pi / frequencies
    stretched = frequencies / factor
    blend = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    between = (1 - blend) * stretched + blend * frequencies
    short = wavelength < original_max_len / high_freq_factor
    long = wavelength > original_max_len / low_freq_factor
    return torch.where(short, frequencies, torch.where(long, stretched, between))


def model_rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """The backbone's RoPE inverse frequencies: plain, or Llama-3-scaled when the config says."""
    frequencies = rope_frequencies(cfg.head_dim, cfg.rope_theta)
    if not cfg.rope_scaling_factor:
        return frequencies
    return llama3_scaled_frequencies(
        frequencies,
        cfg.rope_scaling_factor,
        cfg.rope_low_freq_factor,
        cfg.rope_high_freq_factor,
        cfg.rope_original_max_len,
    )


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, frequencies: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    """cos and sin tables [..., T, head_dim] for integer positions [..., T] (float32);
    ``frequencies`` replaces the plain ``rope_frequencies(head_dim, theta)`` (scaled RoPE)."""
    if frequencies is None:
        frequencies = rope_frequencies(head_dim, theta)
    angles = positions.to(torch.float64)[..., None] * frequencies
    angles = torch.cat([angles, angles], dim=-1)  # rotate-half layout: first and second halves pair
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + head_dim/2) of x [B, H, T, head_dim] by per-position angles
    (cos and sin tables [T, head_dim] or [B, 1, T, head_dim] from ``rope_cos_sin``)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return RotaryFunction.apply(x, cos, sin)
    return rotate_pairs(x, cos, sin, direction=1.0)
