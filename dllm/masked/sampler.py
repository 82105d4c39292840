"""Sampling from a masked-diffusion model: the shared loop (``dllm.sampler.run``) over
semi-autoregressive blocks, with pluggable reveal rules and predictors.

    config = SamplerConfig(FixedCount(steps=64, remasking="low_confidence"), block_length=16)
    canvas = prompt_canvas([prompt_ids], 64, bos_id=tok.eos_id, mask_id=mask_id,
                           max_seq_len=model.config.max_seq_len)
    result = sample(model, config, canvas, torch.Generator().manual_seed(0))
    result.tokens, result.nfe, result.revealed

The loop tiles the canvas's generation region into blocks of ``block_length`` (one block when
None) and decodes them left to right. Inside a block, every step asks the predictor for
p_theta(x0 | x_t) at the block's positions and the rule (``dllm.strategies``) for which masked
positions to fill; only masked positions are ever written, so prompt and fixed tokens survive.
A block ends when it has no masked position left.

Randomness: one CPU ``torch.Generator`` per row (derived from the given generator, or given
per row), so a row's sample does not depend on the rows it is batched with, and the draws of a
step do not depend on whether the network was evaluated or its predictions reused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dllm.canvas import Canvas, mask_token_id
from dllm.predictors import CountingModel, FullForward, Guided, Predictor, ReusePredictions
from dllm.sampler import CACHES, SamplerConfig, SampleResult, row_generators, run


def block_bounds(region: tuple[int, int], block_length: int | None) -> list[tuple[int, int]]:
    """The blocks [start, end) tiling ``region`` left to right."""
    start, end = region
    size = end - start
    if block_length is None:
        return [region]
    if size % block_length:
        valid = [d for d in range(1, size + 1) if size % d == 0]
        raise ValueError(
            f"block_length={block_length} must divide the generation length {size}; "
            f"valid block lengths: {valid}"
        )
    return [(s, s + block_length) for s in range(start, end, block_length)]


def build_predictor(model: CountingModel, config: SamplerConfig, canvas: Canvas) -> Predictor:
    """Predictions for the canvas under ``config``: cached or not, guided or not, reused or not."""

    def one_pass() -> Predictor:
        if config.cache == "none":
            return FullForward(model, canvas.mask_id)
        return CACHES[config.cache](model, canvas.mask_id, canvas.batch_size, canvas.length)

    predictor = one_pass()
    if config.cfg_scale > 0:
        predictor = Guided(
            predictor, one_pass(), config.cfg_scale, canvas.condition, canvas.mask_id
        )
    if config.reuse_predictions:
        predictor = ReusePredictions(predictor)
    return predictor


def check_inputs(model: nn.Module, config: SamplerConfig, canvas: Canvas) -> list[tuple[int, int]]:
    """Validate everything before the first evaluation; returns the blocks."""
    config.validate()
    mask_id = mask_token_id(model)
    if canvas.mask_id != mask_id:
        raise ValueError(
            f"canvas mask_id={canvas.mask_id} must be the model's last vocabulary id {mask_id} "
            "([MASK] is the extra row the diffusion objective adds)"
        )
    canvas.validate(model.config.max_seq_len)
    if config.cfg_scale > 0 and not canvas.condition.any():
        raise ValueError(
            f"cfg_scale={config.cfg_scale} needs a condition, but the canvas fixes no token "
            "besides BOS: give a prompt or fixed positions, or set cfg_scale=0"
        )
    blocks = block_bounds(canvas.region, config.block_length)
    config.strategy.steps_per_block(len(blocks))  # raises when steps do not split evenly
    return blocks


@torch.no_grad()
def sample(
    model: nn.Module,
    config: SamplerConfig,
    canvas: Canvas,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> SampleResult:
    """Fill every [MASK] of ``canvas`` with ``model`` under ``config``; see the module docstring.

    ``generator``: one CPU generator (rows get streams derived from it), one per row (a row then
    samples exactly as it would alone), or None (derived from torch's global generator).
    """
    blocks = check_inputs(model, config, canvas)
    counter = CountingModel(model)
    predictor = build_predictor(counter, config, canvas)
    return run(
        predictor, counter, config, canvas, blocks, row_generators(generator, canvas.batch_size)
    )
