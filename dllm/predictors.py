"""Where a sampler's predictions come from: p_theta(x0 | x_t) at the positions of one block.

A predictor is called as ``predictor(tokens [B, L], (start, end))`` and returns logits
[B, end - start, V] over the real vocabulary (SUBS: the model never predicts [MASK], so that
column is dropped). They stack:

- ``FullForward``: the whole canvas through the network at every call. Exact.
- ``ApproxPrefixCache`` / ``ApproxDualCache``: Fast-dLLM's KV caches. APPROXIMATE: keys and
  values of cached positions are refreshed once per block, so within a block they are stale
  (with bidirectional attention every position's keys depend on every token, including the ones
  revealed since the refresh). Their output drifts from the exact sampler; see the tests.
- ``Guided``: classifier-free guidance over a conditional and an unconditional predictor.
- ``ReusePredictions``: MDLM's p(x0) cache, exact: the network has no time input, so when no
  token changed since the last call, the last predictions are the predictions.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from shared.kv_cache import KVCache

Block = tuple[int, int]


class Predictor(Protocol):
    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor: ...


class CountingModel:
    """Wraps the network and counts its calls: the number of function evaluations (NFE) a sampler
    reports is this count, not a formula."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config
        self.calls = 0

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        self.calls += 1
        return self.model(*args, **kwargs)


def drop_mask_column(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """SUBS: [MASK] is the last vocabulary row and is never a prediction."""
    return logits[..., :mask_id]


def columns(tokens: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Boolean [B, T] selecting columns start..end, to restrict the output head to a block."""
    keep = torch.zeros_like(tokens, dtype=torch.bool)
    keep[:, start:end] = True
    return keep


class FullForward:
    """Exact: every call runs the whole canvas (bidirectional attention) and reads the block."""

    def __init__(self, model: CountingModel, mask_id: int):
        self.model = model
        self.mask_id = mask_id

    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor:
        start, end = block
        logits = self.model(
            tokens, attention="bidirectional", output_mask=columns(tokens, start, end)
        )
        return drop_mask_column(logits.view(tokens.shape[0], end - start, -1), self.mask_id)


class _BlockRefreshedCache:
    """Shared part of the two approximate caches: the first call in a new block runs the full
    canvas and stores every position's keys and values (exact at that moment); later calls in
    the same block recompute only ``window(block)`` and read the rest from the cache."""

    approximate = True

    def __init__(self, model: CountingModel, mask_id: int, batch_size: int, length: int):
        self.model = model
        self.mask_id = mask_id
        params = next(model.model.parameters())
        self.cache = KVCache(model.config, batch_size, length, params.device, params.dtype)
        self.refreshed_for: Block | None = None

    def window(self, tokens: torch.Tensor, block: Block) -> tuple[int, int]:
        raise NotImplementedError

    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor:
        start, end = block
        if block != self.refreshed_for:
            self.refreshed_for = block
            first, last = 0, tokens.shape[1]
        else:
            first, last = self.window(tokens, block)
            if self.model.config.shift_logits:
                # a shifted model reads position start's prediction from slot start - 1, which
                # must be in the forward too (shared.model.shift_predictions)
                first = max(first - 1, 0)
        part = tokens[:, first:last]
        logits = self.model(
            part,
            attention="bidirectional",
            output_mask=columns(part, start - first, end - first),
            cache=self.cache,
            cache_start=first,
        )
        return drop_mask_column(logits.view(tokens.shape[0], end - start, -1), self.mask_id)


class ApproxPrefixCache(_BlockRefreshedCache):
    """APPROXIMATE (Fast-dLLM prefix cache): within a block, the block and everything after it
    are recomputed; the prefix before the block is read from the cache refreshed at the block's
    first step. The prefix is fixed during the block, but its keys and values were computed when
    the block and suffix held other tokens, so they are stale from the second layer on."""

    def window(self, tokens: torch.Tensor, block: Block) -> tuple[int, int]:
        return block[0], tokens.shape[1]


class ApproxDualCache(_BlockRefreshedCache):
    """APPROXIMATE (Fast-dLLM dual cache): within a block only the block is recomputed (written
    in place with ``cache_start``); prefix and suffix come from the cache refreshed at the block's
    first step. Staler than the prefix cache, and cheaper."""

    def window(self, tokens: torch.Tensor, block: Block) -> tuple[int, int]:
        return block


class Guided:
    """Classifier-free guidance: logits = uncond + (scale + 1) (cond - uncond), where the
    unconditional pass sees the canvas with the ``condition`` positions masked. Two network
    evaluations per call, and each pass keeps its own cache."""

    def __init__(
        self,
        conditional: Predictor,
        unconditional: Predictor,
        scale: float,
        condition: torch.Tensor,
        mask_id: int,
    ):
        self.conditional = conditional
        self.unconditional = unconditional
        self.scale = scale
        self.condition = condition
        self.mask_id = mask_id

    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor:
        cond = self.conditional(tokens, block)
        uncond = self.unconditional(tokens.masked_fill(self.condition, self.mask_id), block)
        return guided_logits(cond, uncond, self.scale)


def guided_logits(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """uncond + (scale + 1) (cond - uncond); scale 0 gives the conditional logits back."""
    return uncond + (scale + 1.0) * (cond - uncond)


class ReusePredictions:
    """MDLM's p(x0) cache, exact: returns the previous call's predictions when the tokens and the
    block are unchanged since then, and calls the inner predictor otherwise. Reusing is exact
    because the network ignores t: the same tokens always give the same predictions."""

    def __init__(self, inner: Predictor):
        self.inner = inner
        self.last: tuple[torch.Tensor, Block, torch.Tensor] | None = None

    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor:
        if self.last is not None:
            last_tokens, last_block, last_logits = self.last
            if last_block == block and torch.equal(last_tokens, tokens):
                return last_logits
        logits = self.inner(tokens, block)
        self.last = (tokens.clone(), block, logits)  # the loop edits tokens in place
        return logits
