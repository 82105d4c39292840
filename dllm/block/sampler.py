"""Sampling from a block diffusion model: blocks left to right, masked diffusion inside each.

    config = SamplerConfig(FixedCount(steps=64))
    canvas = prompt_canvas([prompt_ids], 64, bos_id=tok.eos_id, mask_id=mask_id,
                           max_seq_len=model.config.max_seq_len)
    result = sample_blocks(model, config, canvas, block_size=4, generator=g, eos_id=tok.eos_id)

Blocks lie on the training grid: block b covers positions b*size .. (b+1)*size - 1 of the row
(BOS at 0 is in block 0), so a prompt may end inside a block; its tokens there stay fixed and
only the block's [MASK] slots are filled. Inside a block any reveal rule of ``dllm.strategies``
runs as in ``dllm.masked.sampler``; the predictions for block b come from its current tokens
and the finished blocks before it, the same conditioning the block diffusion objective trains.

Two predictors give the same predictions:

- ``BlockCausalForward`` (reference): every call runs the prefix and the block, [0, end), under
  the block-causal mask.
- ``CachedBlocks`` (exact KV cache): finished blocks never change and, under the block-causal
  mask, never attend to anything after them, so their keys and values are final once computed.
  Each call feeds only the block (plus any finished tokens not cached yet, which a block's first
  call commits in the same forward) and reads the prefix from the cache. Both predictors cost
  one network evaluation per call, so the NFE accounting is the same.

With ``eos_id`` the sampler stops after the first block in which every row has produced EOS;
the blocks never decoded are filled with EOS (apply ``dllm.canvas.apply_eos_policy`` to turn
everything after the first EOS into padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dllm.block.objective import block_causal_mask, check_block_size
from dllm.canvas import Canvas, mask_token_id
from dllm.predictors import Block, CountingModel, Predictor, ReusePredictions, drop_mask_column
from dllm.predictors import columns as block_columns
from dllm.sampler import SamplerConfig, SampleResult, row_generators, run
from shared.kv_cache import KVCache


def grid_blocks(region: tuple[int, int], block_size: int, length: int) -> list[Block]:
    """The training-grid blocks [start, end) that cover ``region``, left to right (the last one
    is cut at the canvas ``length``)."""
    start, end = region
    first = (start // block_size) * block_size
    return [(s, min(s + block_size, length)) for s in range(first, end, block_size)]


class BlockCausalForward:
    """Reference: each call runs tokens [0, end) under the block-causal mask and reads the block."""

    def __init__(self, model: CountingModel, mask_id: int, block_size: int):
        self.model = model
        self.mask_id = mask_id
        self.block_size = block_size

    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor:
        start, end = block
        part = tokens[:, :end]
        mask = block_causal_mask(end, self.block_size, tokens.device)
        logits = self.model(part, attention=mask, output_mask=block_columns(part, start, end))
        return drop_mask_column(logits.view(tokens.shape[0], end - start, -1), self.mask_id)


class CachedBlocks:
    """Exact KV cache of the finished blocks (see the module docstring).

    Slots 0..``committed`` of the cache hold final keys and values. A call for block [start, end)
    feeds tokens [committed, end): the finished tokens not cached yet and the block itself, all
    at their own positions, with the block-causal rows of the mask for those positions. The
    block's keys and values land at slots start..end and are overwritten by the next call.
    """

    def __init__(
        self, model: CountingModel, mask_id: int, block_size: int, batch_size: int, length: int
    ):
        self.model = model
        self.mask_id = mask_id
        self.block_size = block_size
        params = next(model.model.parameters())
        self.cache = KVCache(model.config, batch_size, length, params.device, params.dtype)
        self.committed = 0

    def __call__(self, tokens: torch.Tensor, block: Block) -> torch.Tensor:
        start, end = block
        if start < self.committed:
            raise RuntimeError(
                f"block {block} starts before the cached prefix ({self.committed} positions): "
                "blocks must be decoded left to right"
            )
        first = self.committed
        part = tokens[:, first:end]
        mask = block_causal_mask(end, self.block_size, tokens.device)[first:end]
        logits = self.model(
            part,
            attention=mask,
            output_mask=block_columns(part, start - first, end - first),
            cache=self.cache,
            cache_start=first,
        )
        # Everything before the block is finished and now sits in the cache for good.
        self.committed = start
        return drop_mask_column(logits.view(tokens.shape[0], end - start, -1), self.mask_id)


def check_block_inputs(
    model: nn.Module, config: SamplerConfig, canvas: Canvas, block_size: int
) -> list[Block]:
    """Validate everything before the first evaluation; returns the blocks."""
    config.validate()
    check_block_size(block_size)
    if config.block_length not in (None, block_size):
        raise ValueError(
            f"block_length={config.block_length} must be None or the model's "
            f"block_size={block_size}: block diffusion decodes on its training block grid"
        )
    if config.cfg_scale > 0:
        raise ValueError(f"cfg_scale={config.cfg_scale} is not supported by block sampling; use 0")
    if config.cache != "none":
        raise ValueError(
            f"cache={config.cache!r} is not supported by block sampling (it has its own exact "
            "cache, kv_cache=True); use 'none'"
        )
    if model.config.shift_logits:
        raise ValueError(
            "shift_logits models are masked diffusion models; block sampling is for block "
            "diffusion (objective bd), which reads each position's own output"
        )
    mask_id = mask_token_id(model)
    if canvas.mask_id != mask_id:
        raise ValueError(
            f"canvas mask_id={canvas.mask_id} must be the model's last vocabulary id {mask_id}"
        )
    canvas.validate(model.config.max_seq_len)
    blocks = grid_blocks(canvas.region, block_size, canvas.length)
    config.strategy.steps_per_block(len(blocks))  # raises when steps do not split evenly
    return blocks


@torch.no_grad()
def sample_blocks(
    model: nn.Module,
    config: SamplerConfig,
    canvas: Canvas,
    block_size: int,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    *,
    kv_cache: bool = True,
    eos_id: int | None = None,
) -> SampleResult:
    """Fill the [MASK] slots of ``canvas`` block by block; see the module docstring.

    ``kv_cache``: True for the exact cache of finished blocks, False for the reference path.
    ``eos_id``: stop after the block in which every row has generated EOS (None: never stop).
    """
    blocks = check_block_inputs(model, config, canvas, block_size)
    counter = CountingModel(model)
    mask_id = canvas.mask_id
    predictor: Predictor
    if kv_cache:
        predictor = CachedBlocks(counter, mask_id, block_size, canvas.batch_size, canvas.length)
    else:
        predictor = BlockCausalForward(counter, mask_id, block_size)
    if config.reuse_predictions:
        predictor = ReusePredictions(predictor)
    generators = row_generators(generator, canvas.batch_size)
    # An exact cache: the approximate flag stays False (check_block_inputs refuses config.cache).
    return run(
        predictor,
        counter,
        config,
        canvas,
        blocks,
        generators,
        eos_id=eos_id,
        cache="bd_kv" if kv_cache else "none",
    )
