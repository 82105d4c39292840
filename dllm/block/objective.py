"""Block diffusion (BD3-LM style) as a training objective: autoregressive over blocks, masked
diffusion inside each block.

A row of L positions is cut into blocks of ``block_size`` positions (block b covers positions
b*size .. (b+1)*size - 1; BOS at position 0 is the first token of block 0 and is never masked).
Every block gets its own time t_b, and each loss token of the block is replaced by ``[MASK]``
with probability 1 - alpha(t_b). The model predicts block b from its noisy self and the clean
blocks before it, so the NELBO of the row is a sum of per-block masked-diffusion NELBOs:

    sum over blocks b of  w(t_b) * sum over masked i in b of -log p(x_i | x_t in b, x_<b),
    w(t) = -alpha'_t / (1 - alpha_t),

divided by the number of loss tokens: nats per token, comparable with the AR NLL and the MDM
NELBO (block size 1 is next-token prediction from a [MASK] query; block size L is the MDM).

One forward trains every block at once: the input is [noisy row, clean row] (length 2L), both
halves at RoPE positions 0..L-1, under ``two_stream_mask``: a noisy token of block b sees the
noisy tokens of its own block and the clean tokens of blocks < b, and a clean token sees the
clean tokens of blocks <= b. The clean half only supplies keys and values (it carries no loss).

Clipped noise (``t_eps`` .. ``t_max``): BD3-LM draws t from [beta, omega] instead of [0, 1] to
lower the variance of the gradient. A clipped range changes what is estimated: it is no longer
the NELBO but a weighted average over a band of noise levels, so use it for training only and
evaluate with the full range (``t_max=1`` and a small ``t_eps``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from dllm.noise import AbsorbingObjective, check_time_range, diffusion_options
from shared.attention import flex_chosen
from shared.errors import ConfigError
from shared.objective import (
    LossOutput,
    register_objective,
    sum_per_row,
)

# ---- the math, as small pure functions ---------------------------------------------------------


def block_ids(length: int, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[length]: the block index of every position (blocks tile 0..length-1 from position 0)."""
    return torch.arange(length, device=device) // block_size


def block_causal_mask(
    length: int, block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[length, length] bool (True = may attend): position i sees j when block(j) <= block(i).

    This is the one-stream pattern of the sampler and of the per-block reference: clean blocks
    before the current one plus the whole current block, bidirectionally."""
    ids = block_ids(length, block_size, device)
    return ids[None, :] <= ids[:, None]


def two_stream_mask(
    length: int, block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[2L, 2L] bool for the input [noisy (L), clean (L)].

    noisy b -> noisy: only its own block.    noisy b -> clean: blocks < b.
    clean b -> noisy: nothing.               clean b -> clean: blocks <= b.
    """
    ids = block_ids(length, block_size, device)
    query, key = ids[:, None], ids[None, :]
    noisy_to_noisy = query == key
    noisy_to_clean = key < query
    clean_to_noisy = torch.zeros_like(noisy_to_noisy)
    clean_to_clean = key <= query
    top = torch.cat([noisy_to_noisy, noisy_to_clean], dim=1)
    bottom = torch.cat([clean_to_noisy, clean_to_clean], dim=1)
    return torch.cat([top, bottom], dim=0)


@functools.lru_cache(maxsize=16)
def cached_two_stream_mask(length: int, block_size: int, device: torch.device) -> torch.Tensor:
    """``two_stream_mask`` built once per (length, block size, device): every step reuses it."""
    return two_stream_mask(length, block_size, device)


@functools.lru_cache(maxsize=16)
def two_stream_block_mask(length: int, block_size: int, device: torch.device) -> BlockMask:
    """``two_stream_mask`` as a flex-attention ``BlockMask``: the same pattern, stored as which
    tiles are empty, full or partial, so a GPU kernel skips the empty ones."""

    def allowed(batch, head, query, key):
        query_clean, key_clean = query >= length, key >= length
        query_block, key_block = (query % length) // block_size, (key % length) // block_size
        noisy_to_noisy = ~query_clean & ~key_clean & (key_block == query_block)
        noisy_to_clean = ~query_clean & key_clean & (key_block < query_block)
        clean_to_clean = query_clean & key_clean & (key_block <= query_block)
        return noisy_to_noisy | noisy_to_clean | clean_to_clean

    return create_block_mask(allowed, None, None, 2 * length, 2 * length, device=device)


def stratified_block_times(
    n_rows: int, n_blocks: int, generator: torch.Generator, t_low: float, t_high: float
) -> torch.Tensor:
    """[n_rows, n_blocks] times in [t_low, t_high], stratified over all rows * blocks entries.

    Entry k of a random permutation takes stratum k: t = low + (high - low) (k + u) / N with one
    shared uniform u. The batch covers the interval evenly (low variance), and because the
    strata are handed out at random every single block's t is still uniform on [low, high]."""
    total = n_rows * n_blocks
    u = torch.rand((), generator=generator, dtype=torch.float64)
    strata = torch.randperm(total, generator=generator).to(torch.float64)
    t = t_low + (t_high - t_low) * (strata + u) / total
    return t.view(n_rows, n_blocks)


def per_position(values: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """[B, n_blocks] per-block values -> [B, length], each block's value at its positions."""
    return values.repeat_interleave(block_size, dim=1)[:, :length]


def without_bos(scored: torch.Tensor) -> torch.Tensor:
    """``scored`` with position 0 cleared: BOS is context in every block setup, never a target."""
    scored = scored.clone()
    scored[:, 0] = False
    return scored


def check_block_size(block_size: int, seq_len: int | None = None) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive integer")
    if seq_len is not None and seq_len % block_size:
        valid = [d for d in range(1, seq_len + 1) if seq_len % d == 0]
        raise ValueError(
            f"block_size={block_size} must divide the row length {seq_len} (blocks tile "
            f"positions 0..{seq_len - 1}, BOS included); valid block sizes: {valid}"
        )


# ---- the objective -----------------------------------------------------------------------------


@register_objective
class BlockDiffusionObjective(AbsorbingObjective):
    name = "bd"
    # Descriptive only: the loss builds its own boolean mask (``two_stream_mask``) per length.
    attention = "block_causal"
    metric = "nelbo"
    streams = 2  # [noisy row, clean row] through the network per data row
    estimator = "time"  # Bernoulli masks at each block's t (read by eval.likelihood)

    def __init__(
        self,
        *,
        pad_id: int,
        block_size: int,
        mask_id: int | None = None,
        schedule: str = "linear",
        t_eps: float = 1e-3,
        t_max: float = 1.0,
        pad_is_data: bool = False,
    ):
        check_block_size(block_size)
        check_time_range(t_eps, t_max)
        # as in the MDM, padding is data under the padded protocol: a noisy block that saw where
        # its row ends would make the NELBO stop bounding -log p(x)
        super().__init__(
            pad_id=pad_id, mask_id=mask_id, schedule=schedule, t_eps=t_eps, pad_is_data=pad_is_data
        )
        self.block_size = block_size
        self.t_max = t_max
        # The attention path of the two-stream forward: None picks flex attention on CUDA and
        # SDPA with a boolean mask elsewhere (shared.attention.flex_chosen); True/False force one.
        self.flex: bool | None = None

    @classmethod
    def options_from_config(cls, train_config: dict, *, full_noise_range: bool) -> dict:
        t_max = 1.0 if full_noise_range else train_config.get("t_max", 1.0)
        return diffusion_options(train_config) | {
            "block_size": train_config["block_size"],
            "t_max": t_max,
        }

    @classmethod
    def check_config(cls, train_config) -> None:
        block_size, seq_len = train_config.block_size, train_config.seq_len
        if block_size < 1 or seq_len % block_size:
            valid = [d for d in range(1, seq_len + 1) if seq_len % d == 0]
            raise ConfigError(
                f"block_size={block_size} must divide seq_len={seq_len} for "
                f"objective='bd' (blocks tile the whole row, BOS included); valid: {valid}"
            )

    def n_blocks(self, seq_len: int) -> int:
        check_block_size(self.block_size, seq_len)
        return seq_len // self.block_size

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """``t`` [n_rows, n_blocks] (one time per block) and ``uniforms`` [n_rows, seq_len]."""
        t = stratified_block_times(
            n_rows, self.n_blocks(seq_len), generator, self.t_eps, self.t_max
        )
        uniforms = torch.rand((n_rows, seq_len), generator=generator, dtype=torch.float64)
        return {"t": t, "uniforms": uniforms}

    def repeated_noise(
        self, n_rows: int, samples: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Noise for ``samples`` copies of each of ``n_rows`` rows (copies of row 0 first), the
        block times stratified across each row's copies, for Monte-Carlo evaluation."""
        n_blocks = self.n_blocks(seq_len)
        times = [
            stratified_block_times(samples, n_blocks, generator, self.t_eps, self.t_max)
            for _ in range(n_rows)
        ]
        uniforms = torch.rand((n_rows * samples, seq_len), generator=generator, dtype=torch.float64)
        return {"t": torch.cat(times), "uniforms": uniforms}

    def noise_rows(
        self,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(noised tokens, masked positions, per-position weight [B, L]) for the ``scored``
        positions, each masked with its block's probability 1 - alpha(t_b)."""
        length = tokens.shape[1]
        self.n_blocks(length)  # raises when the block size does not tile the row
        scored = without_bos(scored)
        t = per_position(noise["t"].to(tokens.device), self.block_size, length)
        uniforms = noise["uniforms"].to(tokens.device)
        masked = (uniforms < 1.0 - self.schedule.alpha(t)) & scored
        noised = torch.where(masked, torch.full_like(tokens, self.mask_id), tokens)
        return noised, masked, self.schedule.loss_weight(t)

    def loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ) -> LossOutput:
        scored, counted = self.noised_and_counted(tokens, scored)
        scored, counted = without_bos(scored), without_bos(counted)
        noised, masked, weight = self.noise_rows(tokens, noise, scored)
        logits = self.noisy_logits(model, noised, tokens, masked)
        # SUBS: drop the [MASK] column so the softmax runs over real tokens only.
        token_nats = F.cross_entropy(
            logits[:, : self.mask_id].float(), tokens[masked], reduction="none"
        )
        row_of_token = masked.nonzero()[:, 0]
        weighted = token_nats.double() * weight[masked]
        row_nats = sum_per_row(weighted, row_of_token, len(tokens))
        return LossOutput(nats=weighted.sum().float(), n_tokens=counted.sum(), row_nats=row_nats)

    def noisy_logits(
        self,
        model: nn.Module,
        noised: torch.Tensor,
        clean: torch.Tensor,
        output_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of the noisy half from one forward over [noised, clean] (length 2L).

        With ``output_mask`` [B, L] only those noisy positions are returned ([N, V]);
        without it, every noisy position ([B, L, V])."""
        batch, length = noised.shape
        inputs = torch.cat([noised, clean], dim=1)
        positions = torch.arange(length, device=noised.device).repeat(2)
        if flex_chosen(self.flex, noised.device):
            mask = two_stream_block_mask(length, self.block_size, noised.device)
        else:
            mask = cached_two_stream_mask(length, self.block_size, noised.device)
        every_position = output_mask is None
        if every_position:
            output_mask = torch.ones_like(noised, dtype=torch.bool)
        keep = torch.cat([output_mask, torch.zeros_like(output_mask)], dim=1)  # clean half: none
        logits = model(inputs, attention=mask, output_mask=keep, positions=positions)
        return logits.view(batch, length, -1) if every_position else logits
