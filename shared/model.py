"""The Llama-style transformer backbone shared by the autoregressive and diffusion objectives.

Pre-norm RMSNorm, rotary position embeddings on queries and keys (the rotate-half convention of
Hugging Face Llama), SwiGLU feed-forward, grouped-query attention through
``scaled_dot_product_attention``. The attention pattern is the only switch between objectives:
``"causal"`` for next-token prediction, ``"bidirectional"`` for masked diffusion, or an explicit
boolean mask (True = may attend) for anything in between, such as block-causal attention.
Module names follow the Llama reference so checkpoints map one-to-one onto Hugging Face Llama.
The masks and attention kernels (SDPA, flex attention on CUDA) are in ``shared/attention.py``;
RMSNorm and RoPE with their gradients written out (fewer passes than autograd's) in
``shared/ops.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from shared.attention import (
    attention_fp32_on_cpu,
    attention_mask,
    compiled_flex_attention,
    flex_chosen,
    same_for_every_head,
    sliding_window_block_mask,
)
from shared.config import ModelConfig
from shared.kv_cache import CachedLayer, KVCache
from shared.ops import rms_norm
from shared.rope import apply_rope, model_rope_frequencies, rope_cos_sin
from shared.time_embedding import SoftInput, TimeEmbedding, embed_input

# "causal", "bidirectional", a boolean mask [T_q, T_k] or [B, 1, T_q, T_k] (True = may attend), or a
# flex-attention BlockMask (uncached forwards)
Attention = str | torch.Tensor | BlockMask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def shift_predictions(hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states [B, T, d] moved one position right, so the head's output at position i is
    read from position i - 1 (a shifted-logit model: position i - 1 predicts token i, the AR
    layout). Position 0 has nothing before it and keeps its own state: it is BOS in every row,
    never masked and never read, and a cached forward that starts later is widened by one slot
    so that its first output is not read either (``dllm.predictors``)."""
    return torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        bias = cfg.attention_bias  # Qwen2-style q/k/v biases; off adds no parameters at all
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | BlockMask | None,
        is_causal: bool,
        cache: CachedLayer | None = None,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.wq(x).view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.cache.store(cache.layer, cache.start, k, v, cache.end)
        if isinstance(mask, BlockMask):
            # flex attention: a sparse block mask (block diffusion's two streams, a sliding
            # window) that lets a GPU skip fully masked tiles and keep a fused kernel, where SDPA
            # with a dense boolean mask falls back to a slower one
            attend = compiled_flex_attention() if q.is_cuda else flex_attention
            out = attend(q, k, v, block_mask=mask, enable_gqa=self.n_kv_heads != self.n_heads)
        elif length == 1 and self.n_kv_heads != self.n_heads and same_for_every_head(mask):
            out = self._single_query_gqa(q, k, v, mask)
        else:
            out = attention_fp32_on_cpu(
                q, k, v, mask, is_causal, enable_gqa=self.n_kv_heads != self.n_heads
            )
        return self.wo(out.transpose(1, 2).reshape(batch, length, -1))

    def _single_query_gqa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention of one query per row (a decode step) under grouped-query attention.

        The query heads sharing a KV head are laid out as that head's queries [B, H_kv, G, d],
        so SDPA reads each cached key once instead of once per query head (on CPU its GQA path
        costs as much as full multi-head attention). Query head h uses KV head h // G, the same
        grouping as ``enable_gqa``.
        """
        batch, _, _, head_dim = q.shape
        groups = self.n_heads // self.n_kv_heads
        grouped = q.view(batch, self.n_kv_heads, groups, head_dim)
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask)
        return out.view(batch, self.n_heads, 1, head_dim)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = GroupedQueryAttention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | BlockMask | None,
        is_causal: bool,
        cache: CachedLayer | None = None,
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, is_causal, cache)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg.validate()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.time_conditioning:  # absent otherwise: AR and masked models hold no such weights
            self.time_embedding = TimeEmbedding(cfg.dim)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.build_rope_tables()
        # Sliding windows through flex attention: None = where it pays and works (CUDA,
        # shared.attention.use_flex_attention); True or False forces one path.
        self.flex_attention: bool | None = None
        self.reset_parameters()

    def build_rope_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the RoPE cos/sin tables; a model built on the meta device (to load
        weights in place without a first random copy) calls this once it is real."""
        cfg = self.config
        positions = torch.arange(cfg.max_seq_len, device=device)
        frequencies = model_rope_frequencies(cfg).to(positions.device)
        self.rope_cos, self.rope_sin = rope_cos_sin(
            positions, cfg.head_dim, cfg.rope_theta, frequencies
        )

    def materialise(self, device: torch.device | str = "cpu") -> Transformer:
        """Give a model built on the meta device real, uninitialised storage on ``device``, for
        weights loaded next: ``to_empty`` makes each parameter its own tensor, so a tied head is
        tied again, and the RoPE tables, which are computed rather than stored, are computed."""
        self.to_empty(device=device)
        if self.config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.build_rope_tables(device)
        return self

    def reset_parameters(self) -> None:
        # GPT-2 style: N(0, 0.02), with the projections that write into the residual stream scaled
        # down by depth so the residual variance does not grow with the number of layers.
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith(".bias") or name.startswith("time_embedding.out."):
                nn.init.zeros_(param)  # a time embedding starts at zero: see TimeEmbedding
            elif name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(param, std=0.02)

    def forward(
        self,
        tokens: torch.Tensor,
        attention: Attention,
        output_mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        key_valid: torch.Tensor | None = None,
        cache: KVCache | None = None,
        cache_start: int | None = None,
        time: torch.Tensor | None = None,
        soft: SoftInput | None = None,
    ) -> torch.Tensor:
        """Logits for ``tokens`` [B, T].

        ``attention``: "causal", "bidirectional", or a boolean mask (True = may attend) used as is.
        ``output_mask`` [B, T] (bool) restricts the output head to the selected positions and
            returns logits [N_selected, vocab]; the diffusion loss only needs masked positions,
            and skipping the rest saves the largest matmul at small model sizes.
        ``positions`` [B, T] or [T]: RoPE positions (default: the slot index), so left-padded rows
            can start at position 0. With explicit positions an uncached input may be longer
            than ``max_seq_len`` as long as every position is below it.
        ``key_valid`` [B, T]: False marks padding that no token may attend to (uncached forward).
        ``cache`` / ``cache_start``: write keys and values into slots cache_start.. of a
            ``KVCache`` (default: append at ``cache.length``) and attend over the filled slots;
            the new tokens' validity is recorded from ``key_valid`` (default: all real).
        ``time`` [B]: each row's diffusion time in [0, 1]; only a time-conditioned model reads it.
        ``soft``: soft input tokens at some positions (``shared.time_embedding.SoftInput``).
        """
        length = tokens.shape[1]
        start = self._first_slot(length, positions, cache, cache_start)
        slots = torch.arange(start, start + length, device=tokens.device)
        if positions is None:
            positions = slots
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        if cos.dim() == 3:  # per-row positions: broadcast over heads
            cos, sin = cos[:, None], sin[:, None]

        layer_cache: list[CachedLayer | None] = [None] * len(self.layers)
        if cache is not None:
            mask, is_causal = self._cached_mask(attention, cache, slots, start, key_valid)
            end = cache.length
            layer_cache = [CachedLayer(cache, i, start, end) for i in range(len(self.layers))]
        else:
            mask, is_causal = self._uncached_mask(attention, slots, key_valid, flex=True)

        x = embed_input(self, tokens, time, soft)
        for layer, layer_kv in zip(self.layers, layer_cache):
            x = layer(x, cos, sin, mask, is_causal, layer_kv)
        x = self.norm(x)
        if self.config.shift_logits:
            x = shift_predictions(x)
        if output_mask is not None:
            # Every position selected (an AR batch without padding) is a reshape, not a gather
            # whose backward scatters into a zeroed copy. Boolean indexing syncs with the device
            # anyway, so the check costs no extra sync.
            x = x.flatten(0, 1) if bool(output_mask.all()) else x[output_mask]
        return self.output(x)

    def _first_slot(
        self,
        length: int,
        positions: torch.Tensor | None,
        cache: KVCache | None,
        cache_start: int | None,
    ) -> int:
        """The cache slot the input's first token takes (0 without a cache), once the input is
        known to fit the cache, or the model's RoPE tables."""
        start = 0
        if cache is not None:
            start = cache.length if cache_start is None else cache_start
            if start + length > cache.max_len:
                raise ValueError(
                    f"cache overflow: slots {start}..{start + length} exceed the cache's "
                    f"max_len={cache.max_len}"
                )
        elif length > self.config.max_seq_len and positions is None:
            raise ValueError(
                f"sequence length {length} exceeds max_seq_len={self.config.max_seq_len}"
            )
        if positions is not None and length > self.config.max_seq_len:
            # A longer input is fine when its RoPE positions repeat (block diffusion trains on
            # [noisy row, clean row], both at positions 0..L-1); only the tables bound them.
            # Checked only here, so the usual forward pays no device sync for it.
            highest = int(positions.max())
            if highest >= self.config.max_seq_len or int(positions.min()) < 0:
                raise ValueError(
                    f"positions must lie in 0..{self.config.max_seq_len - 1} "
                    f"(max_seq_len={self.config.max_seq_len}); got up to {highest}"
                )
        return start

    def _cached_mask(
        self,
        attention: Attention,
        cache: KVCache,
        slots: torch.Tensor,
        start: int,
        key_valid: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, bool]:
        """Record the new tokens' validity in the cache, extend its length, and pick the
        cheapest correct mask for attending over its filled slots.

        Two common cases need no distance matrix. A forward that writes every slot it attends
        to (a prefill into an empty cache) with no padding is an ordinary forward, so SDPA's
        is_causal applies and it can use its fused kernels. One token appended at the end sees
        every filled slot, so only padding can be masked, read straight from ``cache.valid``.
        """
        length = len(slots)
        appending_one = length == 1 and start == cache.length and key_valid is None
        end = max(cache.length, start + length)
        padded = key_valid is not None and not bool(key_valid.all())
        cache.valid[:, start : start + length] = True if key_valid is None else key_valid
        whole = start == 0 and end == length  # nothing cached before is attended to
        cache.has_padding = padded if whole else cache.has_padding or padded
        cache.length = end
        if whole and not padded:
            return self._uncached_mask(attention, slots, None)
        if appending_one and self._sees_every_slot(attention, end):
            return (cache.valid[:, None, None, :end] if cache.has_padding else None), False
        key_slots = torch.arange(end, device=slots.device)
        return self._mask(attention, slots, key_slots, cache.valid[:, :end]), False

    def _sees_every_slot(self, attention: Attention, end: int) -> bool:
        """Whether a token appended at slot end-1 may attend to every filled slot: causal or
        bidirectional attention (nothing lies after the last slot) with no sliding window cutting
        the cache short. Then the only mask left is padding, which the decode step reads
        straight from ``cache.valid`` instead of building a distance matrix every step."""
        plain = isinstance(attention, str) and attention in ("causal", "bidirectional")
        window = self.config.sliding_window
        return plain and (not window or end <= window)

    def _mask(
        self,
        attention: Attention,
        query_slots: torch.Tensor,
        key_slots: torch.Tensor,
        key_valid: torch.Tensor | None,
    ) -> torch.Tensor:
        if isinstance(attention, BlockMask):
            return attention
        if isinstance(attention, torch.Tensor):
            return attention.to(query_slots.device)
        if attention not in ("causal", "bidirectional"):
            raise ValueError(
                f"attention={attention!r} must be 'causal', 'bidirectional' or a "
                "boolean mask tensor"
            )
        return attention_mask(
            query_slots,
            key_slots,
            causal=attention == "causal",
            window=self.config.sliding_window,
            key_valid=key_valid,
        )

    def _uncached_mask(
        self,
        attention: Attention,
        slots: torch.Tensor,
        key_valid: torch.Tensor | None,
        flex: bool = False,
    ) -> tuple[torch.Tensor | BlockMask | None, bool]:
        """The plain cases need no mask tensor: SDPA's is_causal (or nothing) lets it pick its
        fused kernels. is_causal is only right here, where queries and keys are the same slots.
        A sliding window over unpadded rows becomes a flex ``BlockMask`` when ``flex`` allows it
        and flex attention is in use (``self.flex_attention``); only uncached forwards ask,
        as their length is fixed (compiled flex attention compiles once per length)."""
        window = self.config.sliding_window
        windowed = bool(window and window < len(slots))
        plain = key_valid is None and not windowed
        if plain and attention in ("causal", "bidirectional"):
            return None, attention == "causal"
        if flex and windowed and key_valid is None and attention in ("causal", "bidirectional"):
            if flex_chosen(self.flex_attention, slots.device):
                causal = attention == "causal"
                return sliding_window_block_mask(len(slots), window, causal, slots.device), False
        return self._mask(attention, slots, slots, key_valid), False

    def num_parameters(self, include_embeddings: bool = True) -> int:
        total = sum(p.numel() for p in self.parameters())  # tied weights are counted once
        return total if include_embeddings else total - self.tok_embeddings.weight.numel()


def backbone_config(model: nn.Module) -> ModelConfig:
    """The config of the backbone under the wrappers training may add (DDP's ``.module``)."""
    inner = model
    while not hasattr(inner, "config") and hasattr(inner, "module"):
        inner = inner.module
    return inner.config


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) by the usual count: 6 per matmul weight
    (every linear layer, the output head included; the embedding lookup is not a matmul) plus
    the attention score and value products, 12 * layers * dim * seq_len, counted as if full."""
    per_layer = (
        2 * cfg.dim * cfg.n_heads * cfg.head_dim  # wq, wo
        + 2 * cfg.dim * cfg.n_kv_heads * cfg.head_dim  # wk, wv
        + 3 * cfg.dim * cfg.hidden_dim
    )  # w1, w2, w3
    matmul_weights = cfg.n_layers * per_layer + cfg.dim * cfg.vocab_size
    return 6.0 * matmul_weights + 12.0 * cfg.n_layers * cfg.dim * seq_len
