"""The key/value cache of cached decoding: every layer's keys and values in preallocated slots,
and the view of it that one layer's attention writes into and reads from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.config import ModelConfig


class KVCache:
    """Preallocated keys and values of every layer, [layers, B, n_kv_heads, max_len, head_dim].

    It stores the KV heads, not the query heads, so grouped-query models keep their memory saving.
    ``valid`` [B, max_len] marks slots that hold real tokens (False for left padding), and
    ``length`` is how many slots are filled. A forward with ``cache_start=s`` writes its keys
    and values into slots s..s+T and attends over slots 0..max(length, s+T); writing below
    ``length`` overwrites slots in place, which is how a block of a sequence is recomputed while
    the rest stays cached.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        batch_size: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if max_len > cfg.max_seq_len:
            raise ValueError(f"cache max_len={max_len} exceeds max_seq_len={cfg.max_seq_len}")
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros(batch_size, max_len, device=device, dtype=torch.bool)
        self.length = 0
        # True once any slot was written as padding. While False, a token appended at the end
        # may attend to every filled slot with no mask at all (the common decode step).
        self.has_padding = False

    @property
    def max_len(self) -> int:
        return self.keys.shape[3]

    def store(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, H_kv, T, d] at slots start..start+T; return slots 0..end of the layer."""
        stop = start + k.shape[2]
        self.keys[layer, :, :, start:stop] = k
        self.values[layer, :, :, start:stop] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def crop(self, length: int) -> None:
        """Forget slots from ``length`` on (e.g. to reuse a prompt's cache for another sample)."""
        self.valid[:, length:] = False
        self.length = min(self.length, length)


@dataclass
class CachedLayer:
    """Where one layer's attention reads and writes its KV cache during a cached forward."""

    cache: KVCache
    layer: int
    start: int
    end: int
