"""The one sampling loop of the absorbing-state families (masked and block diffusion): the
settings it takes (``SamplerConfig``), what it hands back (``SampleResult``), and the loop.

The loop decodes blocks [start, end) of a canvas left to right. Inside a block, every step asks
a predictor for p_theta(x0 | x_t) at the block's positions and the rule (``dllm.strategies``)
for which masked positions to fill; only masked positions are ever written, so prompt and fixed
tokens survive. A block ends when it has no masked position left. Each family brings its blocks
and its predictor: ``dllm.masked.sampler.sample`` (semi-autoregressive blocks of any length, the
full forward or the APPROXIMATE caches), ``dllm.block.sampler.sample_blocks`` (the training block
grid, exact KV cache of the finished blocks).

Randomness: one CPU ``torch.Generator`` per row (derived from the given generator, or given
per row), so a row's sample does not depend on the rows it is batched with, and the draws of a
step do not depend on whether the network was evaluated or its predictions reused.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm.canvas import Canvas
from dllm.predictors import (
    ApproxDualCache,
    ApproxPrefixCache,
    CountingModel,
    FullForward,
    Predictor,
)
from dllm.remdm import Remdm
from dllm.strategies import (
    Ancestral,
    EntropyBounded,
    FixedCount,
    StepContext,
    Strategy,
    Threshold,
)
from shared.sampling import SamplingConfig

# Where predictions come from: "none" is the exact full forward, the others are APPROXIMATE.
CACHES = {"none": FullForward, "approx_prefix": ApproxPrefixCache, "approx_dual": ApproxDualCache}


@dataclass(frozen=True)
class SamplerConfig:
    """A reveal rule plus the settings every rule shares.

    ``block_length``: decode the generation region left to right in blocks of this many positions
        (semi-autoregressive); None = one block. Step budgets are split evenly across blocks.
    ``sampling``: temperature / top-k / top-p / min-p for the token draws (temperature 0 = argmax).
    ``cfg_scale``: classifier-free guidance strength s >= 0 (0 = off); costs two evaluations a step.
    ``cache``: "none" (exact) or the APPROXIMATE Fast-dLLM caches "approx_prefix" / "approx_dual".
    ``reuse_predictions``: MDLM's p(x0) cache; exact, it only skips evaluating unchanged canvases.
    """

    strategy: Strategy | Remdm
    block_length: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    cfg_scale: float = 0.0
    cache: str = "none"
    reuse_predictions: bool = True

    def validate(self) -> SamplerConfig:
        if not isinstance(
            self.strategy, Ancestral | FixedCount | Threshold | EntropyBounded | Remdm
        ):
            raise ValueError(
                f"strategy={self.strategy!r} must be an Ancestral, FixedCount, Threshold, "
                "EntropyBounded or Remdm rule"
            )
        self.strategy.validate()
        if self.block_length is not None and (
            isinstance(self.block_length, bool)
            or not isinstance(self.block_length, int)
            or self.block_length < 1
        ):
            raise ValueError(
                f"block_length={self.block_length!r} must be a positive integer or None"
            )
        self.sampling.validate()
        if not (isinstance(self.cfg_scale, int | float) and 0 <= self.cfg_scale < math.inf):
            raise ValueError(f"cfg_scale={self.cfg_scale!r} must be a finite number >= 0 (0 = off)")
        if self.cache not in CACHES:
            raise ValueError(f"cache={self.cache!r} is unknown; valid caches: {sorted(CACHES)}")
        return self

    @property
    def approximate(self) -> bool:
        return self.cache != "none"


@dataclass
class SampleResult:
    """What a sampler hands back.

    ``tokens`` [B, L]: the filled canvas (prompt and fixed tokens included, no [MASK]).
    ``nfe``: network evaluations actually made (CFG counts both passes; reused predictions and
        cached partial forwards count as what they are: 0 and 1).
    ``revealed`` [steps, B]: tokens revealed per step and row; ``nfe_per_step`` and
        ``block_of_step`` say what each step cost and which block it belonged to.
    ``approximate``: True when an APPROXIMATE cache (``cache``) produced the predictions.
    """

    tokens: torch.Tensor
    region: tuple[int, int]
    nfe: int
    revealed: torch.Tensor
    nfe_per_step: list[int]
    block_of_step: list[int]
    cache: str
    approximate: bool

    @property
    def generated(self) -> torch.Tensor:
        """[B, G]: the generation region (for a prompt canvas, the new tokens)."""
        return self.tokens[:, self.region[0] : self.region[1]]

    @property
    def steps(self) -> int:
        return self.revealed.shape[0]


def row_generators(
    generator: torch.Generator | Sequence[torch.Generator] | None, batch_size: int
) -> list[torch.Generator]:
    """One CPU generator per row. From a single generator, row i is seeded with its i-th 62-bit
    draw, so the first rows of a batch see the same streams whatever the batch size."""
    if generator is not None and not isinstance(generator, torch.Generator):
        generators = list(generator)
        if len(generators) != batch_size:
            raise ValueError(
                f"got {len(generators)} generators for {batch_size} rows: give one generator, "
                "or one per row"
            )
        return generators
    source = generator if generator is not None else torch.default_generator
    seeds = torch.randint(0, 2**62, (batch_size,), generator=source)
    return [torch.Generator().manual_seed(int(seed)) for seed in seeds]


def with_model_schedule(config: SamplerConfig, state: Mapping[str, Any]) -> SamplerConfig:
    """An ancestral rule without a schedule steps under the schedule the model was trained with."""
    rule = config.strategy
    if isinstance(rule, Ancestral | Remdm) and rule.schedule is None:
        schedule = state.get("train_config", {}).get("schedule", "linear")
        return dataclasses.replace(config, strategy=dataclasses.replace(rule, schedule=schedule))
    return config


class BlockRun:
    """One block of the loop: the positions it fills (masked when it began) and what its rule
    keeps between steps; ``step`` runs one step on the canvas in place."""

    def __init__(self, start: int, end: int, mask_id: int, tokens: torch.Tensor):
        self.start, self.end, self.mask_id = start, end, mask_id
        self.generated = tokens[:, start:end] == mask_id
        self.memory: dict = {}
        self.revealed = torch.zeros(0)
        self.nfe = 0

    def step(self, predictor, counter, config, tokens, generators, index, steps) -> bool:
        """Step ``index``; False (and nothing done) when the block is finished: nothing masked
        and no corrector that may still remask."""
        start, end, mask_id = self.start, self.end, self.mask_id
        masked = tokens[:, start:end] == mask_id
        if not masked.any() and not getattr(config.strategy, "remasks", False):
            return False
        calls_before = counter.calls
        ctx = StepContext(
            index=index,
            steps=steps,
            masked=masked,
            masked_at_start=self.generated.sum(-1),
            logits=predictor(tokens, (start, end)),
            sampling=config.sampling,
            generators=generators,
            generated=self.generated,
            memory=self.memory,
        )
        reveal, proposal, *remask = config.strategy.step(ctx)
        reveal &= masked  # whatever a rule returns, only masked positions are written
        block = torch.where(reveal, proposal, tokens[:, start:end])
        if remask:  # a corrector remasks only tokens the sampler itself revealed
            block = block.masked_fill(remask[0] & self.generated & ~masked, mask_id)
        tokens[:, start:end] = block
        self.revealed = reveal.sum(-1).cpu()
        self.nfe = counter.calls - calls_before
        return True


@torch.no_grad()
def run(
    predictor: Predictor,
    counter: CountingModel,
    config: SamplerConfig,
    canvas: Canvas,
    blocks: list[tuple[int, int]],
    generators: list[torch.Generator],
    *,
    eos_id: int | None = None,
    cache: str | None = None,
) -> SampleResult:
    """The sampling loop over already validated inputs (``dllm.masked.sampler.sample`` and
    ``dllm.block.sampler.sample_blocks`` are the public entries; tests call this with an
    instrumented predictor).

    ``eos_id``: stop after the block in which every row has generated EOS and fill the blocks
    never decoded with EOS (None: decode every block). ``cache``: the cache label to report
    (default: ``config.cache``).
    """
    device = next(iter(counter.model.parameters()), torch.empty(0)).device
    tokens = canvas.tokens.to(device).clone()
    mask_id = canvas.mask_id
    region_start = canvas.region[0]
    steps = config.strategy.steps_per_block(len(blocks))
    trace = StepTrace()
    for block_index, block in enumerate(blocks):
        decoding = (block_index, block, steps)
        decode_block(predictor, counter, config, tokens, mask_id, decoding, generators, trace)
        if eos_id is not None and (tokens[:, region_start : block[1]] == eos_id).any(-1).all():
            break
    if eos_id is not None:
        tokens = tokens.masked_fill(tokens == mask_id, eos_id)  # blocks after every row's EOS
    if (tokens == mask_id).any():
        raise RuntimeError("internal error: the sampler finished with [MASK] tokens left")
    return SampleResult(
        tokens=tokens,
        region=canvas.region,
        nfe=counter.calls,
        revealed=torch.stack(trace.revealed)
        if trace.revealed
        else torch.zeros(0, canvas.batch_size),
        nfe_per_step=trace.nfe_per_step,
        block_of_step=trace.block_of_step,
        cache=config.cache if cache is None else cache,
        approximate=config.approximate,
    )


@dataclasses.dataclass
class StepTrace:
    """What each step of a sampling loop did: the positions it revealed in each row, the model
    calls it made, the block it decoded."""

    revealed: list[torch.Tensor] = dataclasses.field(default_factory=list)
    nfe_per_step: list[int] = dataclasses.field(default_factory=list)
    block_of_step: list[int] = dataclasses.field(default_factory=list)


def decode_block(
    predictor: Predictor,
    counter: CountingModel,
    config: SamplerConfig,
    tokens: torch.Tensor,
    mask_id: int,
    decoding: tuple[int, tuple[int, int], int | None],
    generators: list[torch.Generator],
    trace: StepTrace,
) -> None:
    """Reveal the masked positions of block ``decoding = (index, (start, end), steps)`` of
    ``tokens`` in place, step by step under the config's rule (``steps`` of them, or until the
    block is done when the rule sets no count: ``BlockRun.step``), recording each step in
    ``trace``."""
    block_index, (start, end), steps = decoding
    block = BlockRun(start, end, mask_id, tokens)
    for index in range(steps) if steps is not None else itertools.count():
        if not block.step(predictor, counter, config, tokens, generators, index, steps):
            break
        trace.revealed.append(block.revealed)
        trace.nfe_per_step.append(block.nfe)
        trace.block_of_step.append(block_index)
