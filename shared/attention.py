"""Attention kernels and masks of the backbone: the boolean masks (True = may attend) built from
slot indices, SDPA with the CPU's bf16 detour, and flex attention where it pays.

Flex attention (``torch.nn.attention.flex_attention``) takes a ``BlockMask``: the pattern stored
as which tiles are empty, full or partial, so a GPU kernel skips the empty tiles and stays fused.
SDPA keeps its flash kernel only without an explicit mask; with a boolean mask (block diffusion's
two streams, a sliding window) it falls back to slower kernels. Flex is used on CUDA where it
works (``use_flex_attention`` tries it once per device and says once in the log when it does
not); on a CPU its eager path is a reference implementation, slower than SDPA, and has no
backward, so CPUs keep SDPA.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

log = logging.getLogger(__name__)


def attention_mask(
    query_slots: torch.Tensor,
    key_slots: torch.Tensor,
    *,
    causal: bool,
    window: int = 0,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask (True = may attend) from slot indices: [T_q, T_k], or [B, 1, T_q, T_k] when
    ``key_valid`` [B, T_k] marks which keys are real tokens (False for padding).

    Slots are positions in the sequence (or in a KV cache). A query always sees its own slot, so
    a padding query never has every key masked: SDPA would return NaN there, and the NaN would
    reach real tokens through the next layer's keys and values even though they are masked.
    """
    distance = query_slots[:, None] - key_slots[None, :]
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if causal:
        allowed &= distance >= 0
    if window:
        allowed &= distance.abs() < window
    if key_valid is None:
        return allowed
    return (allowed & key_valid[:, None, None, :]) | (distance == 0)


def positional_mask(
    query_slots: torch.Tensor,
    key_slots: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    *,
    window: int = 0,
) -> torch.Tensor:
    """[B, 1, T_q, T_k] boolean mask for rows whose tokens do not sit at their RoPE positions
    (a permuted row): causal over the slots (the order the tokens are processed in), and a
    sliding ``window`` (0 = none) over the positions [B, T_q] / [B, T_k], the tokens' places in
    the text. A window over slots would keep a random subset of each token's neighbours there;
    this one keeps the same neighbours as the slot window of an unpermuted row."""
    allowed = (query_slots[:, None] >= key_slots[None, :])[None, None]
    return allowed & within_window(query_positions, key_positions, window)


def within_window(
    query_positions: torch.Tensor, key_positions: torch.Tensor, window: int
) -> torch.Tensor:
    """[B, 1, T_q, T_k]: True where a key's position lies within ``window`` of the query's
    (every key when ``window`` is 0), for masks of permuted rows that carry the model's window."""
    distance = query_positions[:, :, None] - key_positions[:, None, :]
    return (distance.abs() < window if window else torch.ones_like(distance, dtype=torch.bool))[
        :, None
    ]


def attention_fp32_on_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
) -> torch.Tensor:
    """SDPA, in float32 when bf16 inputs are on a CPU. The CPU flash kernel's bf16 backward is
    about 2.6x slower than its fp32 one (bench/profile_step.py, demo-d256 shape: 104 vs 39 ms
    per step), so attention there runs in fp32 and casts back: faster, and more precise. Forward
    passes without a backward (validation under autocast) take the same path, so a model is
    validated in the precision it trains in. A GPU keeps bf16, where its kernels are fastest."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(
                q.float(),
                k.float(),
                v.float(),
                attn_mask=mask,
                is_causal=is_causal,
                enable_gqa=enable_gqa,
            )
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=enable_gqa
    )


@functools.cache
def compiled_flex_attention():
    """Flex attention compiled once per process: on a GPU its fused kernel exists only compiled
    (eagerly it runs a dense reference implementation)."""
    return torch.compile(flex_attention, dynamic=False)


def same_for_every_head(mask: torch.Tensor | None) -> bool:
    """Whether a mask ([T_q, T_k] or [B, 1, T_q, T_k]) applies alike to every head."""
    return mask is None or mask.dim() < 3 or mask.shape[-3] == 1


@functools.lru_cache(maxsize=16)
def sliding_window_block_mask(
    length: int, window: int, causal: bool, device: torch.device
) -> BlockMask:
    """``attention_mask(slots, slots, causal=causal, window=window)`` as a flex ``BlockMask``."""

    def allowed(batch, head, query, key):
        near = (query - key).abs() < window
        return near & (key <= query) if causal else near

    return create_block_mask(allowed, None, None, length, length, device=device)


@functools.cache
def flex_attention_problem(device: torch.device) -> str | None:
    """Why compiled flex attention cannot run on ``device`` (no Triton, an old GPU, a torch
    without it...), or None: runs one small masked attention once per device."""
    try:
        q = torch.randn(1, 1, 128, 16, device=device)
        mask = sliding_window_block_mask(128, 16, True, device)
        compiled_flex_attention()(q, q, q, block_mask=mask)
    except Exception as error:  # any failure means the path is unusable here
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first_line}"[:300]
    return None


def use_flex_attention(device: torch.device) -> bool:
    """Flex attention where it pays and works: CUDA devices on which it compiles and runs. When
    it does not, the SDPA path with a boolean mask is used, and the log says so once."""
    if device.type != "cuda":
        return False
    problem = flex_attention_problem(device)
    if problem is not None:
        _say_once(
            f"flex attention is unavailable on {device} ({problem}); masked attention "
            "(block diffusion, sliding windows) uses SDPA with a boolean mask"
        )
    return problem is None


def flex_chosen(forced: bool | None, device: torch.device) -> bool:
    """A component's choice of attention path: ``forced`` True/False, or None for the default
    (``use_flex_attention``)."""
    return use_flex_attention(device) if forced is None else forced


@functools.cache
def _say_once(message: str) -> None:
    log.warning(message)
