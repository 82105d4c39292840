"""The block family's entry in the family registry: what ``DiffusionGenerator`` calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dllm.block.objective import BlockDiffusionObjective
from dllm.block.sampler import grid_blocks, sample_blocks
from dllm.canvas import Canvas, mask_token_id
from dllm.families import Family, SampleRequest, register_family
from dllm.sampler import SamplerConfig, SampleResult, with_model_schedule


def block_size(state: Mapping[str, Any]) -> int:
    """The block size the model was trained with (its sampler decodes on that grid)."""
    return int(state["train_config"]["block_size"])


def decoded_positions(canvas: Canvas, state: Mapping[str, Any]) -> int:
    """Every position of the training-grid blocks that cover the generation region."""
    size = block_size(state)
    return len(grid_blocks(canvas.region, size, canvas.length)) * size


def sample_request(request: SampleRequest) -> SampleResult:
    """``sample_blocks`` under the model's schedule and block size."""
    config = with_model_schedule(request.config, request.state)
    return sample_blocks(
        request.model,
        config,
        request.canvas,
        block_size(request.state),
        request.generator,
        kv_cache=request.kv_cache,
        eos_id=request.stop_id,
    )


FAMILY = register_family(
    Family(
        name=BlockDiffusionObjective.name,
        config_type=SamplerConfig,
        sample=sample_request,
        generation_id=mask_token_id,
        decoded_positions=decoded_positions,
        block_size=block_size,
    )
)
