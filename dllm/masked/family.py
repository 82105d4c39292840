"""The masked family's entry in the family registry: what ``DiffusionGenerator`` calls."""

from __future__ import annotations

from dllm.canvas import mask_token_id
from dllm.families import Family, SampleRequest, register_family
from dllm.masked.objective import MaskedDiffusionObjective
from dllm.masked.sampler import sample
from dllm.sampler import SamplerConfig, SampleResult, with_model_schedule


def sample_request(request: SampleRequest) -> SampleResult:
    """``sample`` under the model's schedule; the masked sampler's caches are chosen by
    ``SamplerConfig.cache``, so ``kv_cache=False`` is refused."""
    if not request.kv_cache:
        raise ValueError(
            "kv_cache=False applies to block diffusion (bd) models only; this is an "
            "'mdm' model (its caches are chosen by SamplerConfig.cache)"
        )
    config = with_model_schedule(request.config, request.state)
    return sample(request.model, config, request.canvas, request.generator)


FAMILY = register_family(
    Family(
        name=MaskedDiffusionObjective.name,
        config_type=SamplerConfig,
        sample=sample_request,
        generation_id=mask_token_id,
    )
)
