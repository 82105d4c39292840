"""The uniform-state family's entry in the family registry: what ``DiffusionGenerator`` calls."""

from __future__ import annotations

from dllm.families import Family, SampleRequest, register_family
from dllm.sampler import SampleResult, row_generators
from dllm.uniform.objective import UniformDiffusionObjective
from dllm.uniform.sampler import UniformSamplerConfig, sample_uniform, uniform_canvas
from shared.model import Transformer
from shared.tokenizer import Tokenizer


def free_position_id(model: Transformer, tokenizer: Tokenizer | None = None) -> int:
    """The id that marks a udm canvas's positions to generate: one past the model's vocabulary,
    which has exactly the tokenizer's ids (no [MASK] row)."""
    vocab = model.config.vocab_size
    if tokenizer is not None and tokenizer.vocab_size != vocab:
        raise ValueError(
            f"the model's vocabulary has {vocab} rows, but a udm model has exactly the "
            f"tokenizer's {tokenizer.vocab_size} ids: is this a udm model with its own tokenizer?"
        )
    return vocab


def sample_request(request: SampleRequest) -> SampleResult:
    """The uniform-state sampler (``dllm.uniform.sampler``) on a udm model's canvas: the
    positions to generate start as z_1 draws, replaced before the first forward."""
    if not request.kv_cache:
        raise ValueError("kv_cache=False applies to block diffusion (bd) models only")
    if request.pad_id is None:
        raise ValueError("eos='stop' needs a padding id: give a tokenizer or pad_id")
    model, canvas, config = request.model, request.canvas, request.config
    free = canvas.masked
    generators = row_generators(request.generator, canvas.batch_size)
    n_support = model.config.vocab_size - 1
    noised = uniform_canvas(canvas.tokens, free, n_support, request.pad_id, generators)
    result = sample_uniform(model, noised, free, config, generators, request.pad_id)
    return SampleResult(
        tokens=result.tokens,
        region=canvas.region,
        nfe=result.nfe,
        revealed=result.changed,
        nfe_per_step=[1] * config.steps,
        block_of_step=[0] * config.steps,
        cache="none",
        approximate=False,
    )


FAMILY = register_family(
    Family(
        name=UniformDiffusionObjective.name,
        config_type=UniformSamplerConfig,
        sample=sample_request,
        generation_id=free_position_id,
    )
)
