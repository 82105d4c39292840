"""Sampling from an Eso-LM: a masked-diffusion phase, then an autoregressive phase, both over
one KV cache.

Each row draws a random order of its positions to generate. The diffusion phase reveals the
first ``round(alpha_0 n)`` of them in that order, in ``steps`` chunks of equal size (the
expected counts of alpha_t = alpha_0 (1 - t) on an even time grid, as the other families' step
counts are); the autoregressive phase then reveals the rest left to right, one per evaluation.
Every forward is causal over the tokens in the order they became clean, each at its own RoPE
position, as the objective trained it (``dllm.eso.objective``): a step feeds the tokens the
previous step revealed (now clean keys) and the [MASK] queries of the positions it reveals,
so the cache only ever holds clean tokens. ``kv_cache=False`` recomputes every clean token
each step instead, the reference the cache is tested against.

Randomness: one CPU generator per row (order, then token draws in float64), so a row's sample
does not depend on its batch mates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from dllm.canvas import Canvas
from dllm.eso.objective import check_alpha_0, permuted_attention
from dllm.predictors import CountingModel
from dllm.sampler import SampleResult
from shared.kv_cache import KVCache
from shared.sampling import SamplingConfig, sample_from_logits


@dataclass(frozen=True)
class EsoSamplerConfig:
    """``steps``: evaluations of the diffusion phase (chunks; fewer when it reveals fewer
    positions). ``alpha_0``: the share of the positions to generate that the diffusion phase
    reveals; None = the alpha_0 the model trained with (0 = autoregressive, 1 = no AR phase).
    ``sampling``: temperature / top-k / top-p / min-p of the token draws."""

    steps: int
    alpha_0: float | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    @property
    def name(self) -> str:
        return "eso"

    def validate(self) -> EsoSamplerConfig:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps={self.steps!r} must be a positive integer")
        if self.alpha_0 is not None:
            check_alpha_0(self.alpha_0, "alpha_0 (--alpha-0)")
        self.sampling.validate()
        return self


def chunk_sizes(revealed: int, steps: int) -> list[int]:
    """``revealed`` positions over at most ``steps`` chunks, as even as integers allow (the
    larger chunks first), empty chunks dropped."""
    used = min(steps, revealed)
    base, extra = divmod(revealed, used) if used else (0, 0)
    return [base + (i < extra) for i in range(used)]


def reveal_plan(
    masked: torch.Tensor, alpha_0: float, steps: int, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, list[int]]:
    """[B, n] the positions each row reveals, in reveal order (its diffusion positions in a
    random order, then its AR positions ascending), and the chunk sizes: the diffusion chunks,
    then one per AR position. Every row must have the same number n of masked positions."""
    counts = masked.sum(-1)
    n = int(counts[0])
    if not bool((counts == n).all()):
        raise ValueError("every row of an Eso canvas must have the same number of [MASK]s")
    diffused = round(alpha_0 * n)
    orders = []
    for row, generator in zip(masked, generators):
        positions = row.nonzero().flatten().cpu()
        shuffled = positions[torch.randperm(n, generator=generator)]
        tail = shuffled[diffused:].sort().values
        orders.append(torch.cat([shuffled[:diffused], tail]))
    plan = torch.stack(orders).to(masked.device)
    return plan, chunk_sizes(diffused, steps) + [1] * (n - diffused)


def draw(logits: torch.Tensor, config: SamplingConfig, generators) -> torch.Tensor:
    """[B, q] tokens from logits [B, q, V] (float64 draws, one generator per row)."""
    return torch.stack([sample_from_logits(row, config, g) for row, g in zip(logits, generators)])


class EsoDecoder:
    """The tokens that are clean, in the order they became clean, and one forward of the
    [MASK] queries of a chunk over them: through the cache, or recomputed from scratch."""

    def __init__(self, model: CountingModel, canvas: Canvas, kv_cache: bool):
        self.model, self.mask_id, self.kv_cache = model, canvas.mask_id, kv_cache
        fixed = ~canvas.masked
        # Fixed tokens (BOS, the prompt) in their natural order; every row fixes the same count.
        self.positions = torch.stack([row.nonzero().flatten() for row in fixed])
        self.tokens = canvas.tokens.gather(1, self.positions)
        self.cached = 0  # clean tokens already in the cache
        params = next(model.model.parameters())
        batch, length = canvas.tokens.shape
        if kv_cache:
            self.cache = KVCache(model.config, batch, length, params.device, params.dtype)

    def predict(self, query_positions: torch.Tensor) -> torch.Tensor:
        """Logits [B, q, V] at the [MASK] queries of ``query_positions`` [B, q]."""
        start = self.cached if self.kv_cache else 0
        inputs = torch.cat(
            [self.tokens[:, start:], torch.full_like(query_positions, self.mask_id)], 1
        )
        keys = torch.cat([self.positions, query_positions], 1)
        positions = keys[:, start:]
        attention = permuted_attention(self.model.config.sliding_window, keys, start)
        output = torch.zeros_like(inputs, dtype=torch.bool)
        output[:, -query_positions.shape[1] :] = True
        if not self.kv_cache:
            logits = self.model(
                inputs, attention=attention, output_mask=output, positions=positions
            )
        else:
            self.cache.crop(self.cached)  # forget the previous step's [MASK] queries
            logits = self.model(
                inputs,
                attention=attention,
                output_mask=output,
                positions=positions,
                cache=self.cache,
                cache_start=self.cached,
            )
            self.cached = self.tokens.shape[1]
        return logits.view(*query_positions.shape, -1)[..., : self.mask_id]

    def reveal(self, positions: torch.Tensor, tokens: torch.Tensor) -> None:
        self.positions = torch.cat([self.positions, positions], 1)
        self.tokens = torch.cat([self.tokens, tokens], 1)


@torch.no_grad()
def sample_eso(
    model: nn.Module,
    config: EsoSamplerConfig,
    canvas: Canvas,
    alpha_0: float,
    generators: Sequence[torch.Generator],
    kv_cache: bool = True,
) -> SampleResult:
    """Fill every [MASK] of ``canvas``: ``alpha_0`` is the model's (``config.alpha_0`` wins)."""
    config.validate()
    canvas.validate(model.config.max_seq_len)
    share = alpha_0 if config.alpha_0 is None else config.alpha_0
    plan, chunks = reveal_plan(canvas.masked, share, config.steps, generators)
    counter = CountingModel(model)
    decoder = EsoDecoder(counter, canvas, kv_cache)
    tokens = canvas.tokens.clone()
    revealed, done = [], 0
    for size in chunks:
        positions = plan[:, done : done + size]
        drawn = draw(decoder.predict(positions), config.sampling, generators)
        decoder.reveal(positions, drawn)
        tokens.scatter_(1, positions, drawn)
        revealed.append(torch.full((canvas.batch_size,), size))
        done += size
    return SampleResult(
        tokens=tokens,
        region=canvas.region,
        nfe=counter.calls,
        revealed=torch.stack(revealed),
        nfe_per_step=[1] * len(chunks),
        block_of_step=[0] * len(chunks),
        cache="kv" if kv_cache else "none",
        approximate=False,
    )
