"""The Eso-LM family's entry in the family registry: what ``DiffusionGenerator`` calls."""

from __future__ import annotations

from dllm.canvas import Canvas, mask_token_id
from dllm.eso.objective import EsoObjective
from dllm.eso.sampler import EsoSamplerConfig, sample_eso
from dllm.families import Family, SampleRequest, register_family
from dllm.sampler import SampleResult, row_generators


def sample_request(request: SampleRequest) -> SampleResult:
    """``sample_eso`` at the alpha_0 the model trained with (the settings may override it);
    ``kv_cache=False`` is the reference path that recomputes every clean token each step."""
    alpha_0 = float(request.state["train_config"]["alpha_0"])
    generators = row_generators(request.generator, request.canvas.batch_size)
    return sample_eso(
        request.model, request.config, request.canvas, alpha_0, generators, request.kv_cache
    )


def decoded_positions(canvas: Canvas, state) -> int:
    """Every position to generate takes at most one evaluation (the AR phase's bound)."""
    return int(canvas.masked.sum(-1).max())


FAMILY = register_family(
    Family(
        name=EsoObjective.name,
        config_type=EsoSamplerConfig,
        sample=sample_request,
        generation_id=mask_token_id,
        decoded_positions=decoded_positions,
    )
)
