"""The diffusion generation engine (mdm and bd): the counterpart of ``arlm.generate.ARGenerator``.

    generator = DiffusionGenerator.from_checkpoint("runs/demo/mdm")
    result = generator.generate(["In the beginning"], 64, SamplerConfig(FixedCount(64)), seed=0)
    result.texts, result.tokens, result.nfe, result.raw.revealed

The generator owns the whole chain from prompts to text, so no caller wires it up again:

- the [MASK] id (``dllm.canvas.mask_token_id``: the model's last vocabulary row);
- the canvas: ``[BOS] + prompt + [MASK] * gen_length``, optionally ``+ suffix`` (infilling), or
  any set of fixed positions (``infill_canvas``); prompts are texts or token ids;
- the sampler, picked from the checkpoint's objective: ``dllm.generate.sample`` for a masked
  diffusion (mdm) model, ``dllm.block_generate.sample_blocks`` (the training block grid, exact KV
  cache of the finished blocks) for a block diffusion (bd) model. An ancestral rule without a
  schedule steps under the schedule the model was trained with (``with_model_schedule``);
- the EOS policy (``dllm.canvas.apply_eos_policy``) and decoding.

Randomness is that of the samplers: ``seed`` becomes ``torch.Generator().manual_seed(seed)``, from
which each row's stream is derived (``dllm.generate.row_generators``); pass ``generator`` (one,
or one per row) to control the streams yourself. The same seed gives the same tokens as calling
the samplers directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm.block_generate import grid_blocks, sample_blocks
from dllm.canvas import (
    Canvas,
    apply_eos_policy,
    check_eos_policy,
    infill_canvas,
    mask_token_id,
    prompt_canvas,
)
from dllm.generate import SamplerConfig, SampleResult, row_generators, sample
from dllm.strategies import Ancestral
from dllm.uniform_generate import UniformSamplerConfig, sample_uniform, uniform_canvas
from shared.checkpoint import load_model_from_checkpoint
from shared.model import Transformer
from shared.tokenizer import Tokenizer

DIFFUSION_OBJECTIVES = ("mdm", "bd", "udm")

Prompt = str | Sequence[int]
Generators = torch.Generator | Sequence[torch.Generator] | None


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


def with_model_schedule(config: SamplerConfig, state: Mapping[str, Any]) -> SamplerConfig:
    """An ancestral rule without a schedule steps under the schedule the model was trained with."""
    rule = config.strategy
    if isinstance(rule, Ancestral) and rule.schedule is None:
        schedule = state.get("train_config", {}).get("schedule", "linear")
        return dataclasses.replace(config, strategy=dataclasses.replace(rule, schedule=schedule))
    return config


def objective_of(state: Mapping[str, Any], source: str = "the checkpoint") -> str:
    """The run's diffusion objective ("mdm", "bd" or "udm"); refuses anything else."""
    objective = state.get("objective")
    if objective not in DIFFUSION_OBJECTIVES:
        raise ValueError(
            f"{source} was trained with objective {objective!r}: diffusion generation needs an "
            "'mdm', 'bd' or 'udm' checkpoint (an autoregressive model generates with "
            "arlm.generate.ARGenerator)"
        )
    return objective


@dataclass
class DiffusionResult:
    """What ``DiffusionGenerator.generate`` hands back.

    ``texts[i]``: the decoded generation of row i after the EOS policy (None without a tokenizer).
    ``tokens[i]``: the ids of that generation: the canvas's generation region, cut before the
        first EOS under ``eos="stop"``, whole under "pad" and "none".
    ``raw``: the sampler's own result, before the EOS policy (the filled canvas, per-step reveal
        counts, NFE per step, the cache used and whether it was approximate).
    """

    texts: list[str] | None
    tokens: list[list[int]]
    raw: SampleResult

    @property
    def nfe(self) -> int:
        return self.raw.nfe

    @property
    def approximate(self) -> bool:
        return self.raw.approximate


class DiffusionGenerator:
    """Generation engine around one masked-diffusion (mdm) or block-diffusion (bd) ``Transformer``.

    ``state``: the checkpoint's saved state; its "objective" picks the sampler and its
    "train_config" gives the noise schedule and (bd) the block size. None means an mdm model
    trained under the linear schedule.
    ``tokenizer`` is optional: without it prompts must be token ids and there is no text output;
    ``eos_id`` (which also opens every row as BOS) and ``pad_id`` then come from the arguments.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer | None = None,
        state: Mapping[str, Any] | None = None,
        *,
        eos_id: int | None = None,
        pad_id: int | None = None,
    ):
        self.state = {"objective": "mdm"} if state is None else state
        self.objective = objective_of(self.state)
        self.model = model
        self.tokenizer = tokenizer
        # A uniform-state model has no [MASK] row: its canvas marks the positions to generate
        # with the id one past its vocabulary, and the sampler replaces them with z_1 draws
        # before the first forward.
        self.mask_id = (
            free_position_id(model, tokenizer)
            if self.objective == "udm"
            else mask_token_id(model, tokenizer)
        )
        self.eos_id = eos_id if eos_id is not None else getattr(tokenizer, "eos_id", None)
        self.pad_id = pad_id if pad_id is not None else getattr(tokenizer, "pad_id", None)
        self.block_size = (
            int(self.state["train_config"]["block_size"]) if self.objective == "bd" else None
        )

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu"
    ) -> DiffusionGenerator:
        """Load a training checkpoint (or the newest valid one under a run directory)."""
        model, tokenizer, state = load_model_from_checkpoint(Path(path), device)
        objective_of(state, str(path))  # the error names the checkpoint
        return cls(model, tokenizer, state)

    # ---- canvases

    def prompt_canvas(
        self,
        prompts: Sequence[Prompt],
        gen_length: int,
        *,
        suffix: Prompt | None = None,
    ) -> Canvas:
        """Rows ``[BOS] + prompt + [MASK] * gen_length (+ suffix)``. Prompts and the suffix are
        texts or token ids (ids without BOS: the canvas adds it); an empty suffix is none."""
        return prompt_canvas(
            self._ids(prompts),
            gen_length,
            bos_id=self._bos_id(),
            mask_id=self.mask_id,
            max_seq_len=self.model.config.max_seq_len,
            suffix=self._ids([suffix])[0] if suffix else (),
        )

    def infill_canvas(
        self, length: int, fixed: Mapping[int, int] | Sequence[Mapping[int, int]]
    ) -> Canvas:
        """Rows of ``length`` positions: BOS at 0, ``fixed[position] = token`` kept, the rest
        masked (one mapping, or one per row)."""
        return infill_canvas(
            length,
            fixed,
            bos_id=self._bos_id(),
            mask_id=self.mask_id,
            max_seq_len=self.model.config.max_seq_len,
        )

    def steps_per_position(self, canvas: Canvas) -> int:
        """One step per position the sampler decodes: the generation region of an mdm canvas,
        every position of the training-grid blocks that cover it for a bd model."""
        start, end = canvas.region
        if self.block_size is None:
            return end - start
        return len(grid_blocks(canvas.region, self.block_size, canvas.length)) * self.block_size

    # ---- sampling

    def generate(
        self,
        prompts: Sequence[Prompt],
        gen_length: int,
        config: SamplerConfig,
        *,
        seed: int = 0,
        generator: Generators = None,
        eos: str = "stop",
        suffix: Prompt | None = None,
        kv_cache: bool = True,
        early_stop: bool = True,
    ) -> DiffusionResult:
        """Sample ``gen_length`` tokens after each prompt (before ``suffix``, when given) and
        return them after the ``eos`` policy; see ``fill`` for the keyword arguments."""
        canvas = self.prompt_canvas(prompts, gen_length, suffix=suffix)
        return self.fill(
            canvas,
            config,
            seed=seed,
            generator=generator,
            eos=eos,
            kv_cache=kv_cache,
            early_stop=early_stop,
        )

    def fill(
        self,
        canvas: Canvas,
        config: SamplerConfig,
        *,
        seed: int = 0,
        generator: Generators = None,
        eos: str = "stop",
        kv_cache: bool = True,
        early_stop: bool = True,
    ) -> DiffusionResult:
        """Fill every [MASK] of ``canvas`` and apply the ``eos`` policy to its generation region.

        ``seed``: the sampler's generator is ``torch.Generator().manual_seed(seed)`` unless
            ``generator`` (one, or one per row) is given.
        ``eos``: "stop", "pad" or "none" (``dllm.canvas.apply_eos_policy``).
        ``kv_cache`` (bd only): False recomputes the finished blocks at every step (the
            reference path; same tokens).
        ``early_stop`` (bd only): with ``eos="stop"``, end after the block in which every row
            has produced EOS (fewer evaluations, same texts and tokens); False decodes every
            block. An mdm sampler always decodes the whole canvas.
        """
        check_eos_policy(eos)
        # Both ids are checked before the first step: a missing one fails fast, not after sampling.
        eos_id = None if eos == "none" else self._eos_id()
        pad_id = self._pad_id() if eos == "stop" else self.pad_id
        if generator is None:
            generator = torch.Generator().manual_seed(seed)
        stop_id = eos_id if early_stop else None
        raw = self._sample(canvas, config, generator, kv_cache=kv_cache, stop_id=stop_id)
        tokens, lengths = apply_eos_policy(
            raw.tokens, raw.region, eos, eos_id=eos_id, pad_id=pad_id
        )
        start = raw.region[0]
        ids = [row[start : start + n].tolist() for row, n in zip(tokens, lengths.tolist())]
        texts = None if self.tokenizer is None else [self.tokenizer.decode(row) for row in ids]
        return DiffusionResult(texts=texts, tokens=ids, raw=raw)

    def _sample(
        self,
        canvas: Canvas,
        config: SamplerConfig,
        generator: Generators,
        *,
        kv_cache: bool,
        stop_id: int | None,
    ) -> SampleResult:
        """The sampler of this objective under the model's schedule (see the module docstring);
        ``stop_id``: the EOS id a bd sampler stops after (None: decode every block)."""
        if self.objective == "udm" or isinstance(config, UniformSamplerConfig):
            return self._sample_uniform(canvas, config, generator, kv_cache=kv_cache)
        config = with_model_schedule(config, self.state)
        if self.block_size is None:
            if not kv_cache:
                raise ValueError(
                    "kv_cache=False applies to block diffusion (bd) models only; this is an "
                    "'mdm' model (its caches are chosen by SamplerConfig.cache)"
                )
            return sample(self.model, config, canvas, generator)
        return sample_blocks(
            self.model,
            config,
            canvas,
            self.block_size,
            generator,
            kv_cache=kv_cache,
            eos_id=stop_id,
        )

    def _sample_uniform(
        self, canvas: Canvas, config: UniformSamplerConfig, generator: Generators, *, kv_cache
    ) -> SampleResult:
        """The uniform-state sampler (``dllm.uniform_generate``) on a udm model's canvas."""
        if self.objective != "udm" or not isinstance(config, UniformSamplerConfig):
            raise ValueError(
                f"a {self.objective!r} model samples with SamplerConfig and a udm model with "
                f"UniformSamplerConfig; got {type(config).__name__}"
            )
        if not kv_cache:
            raise ValueError("kv_cache=False applies to block diffusion (bd) models only")
        free = canvas.masked
        generators = row_generators(generator, canvas.batch_size)
        n_support = self.model.config.vocab_size - 1
        pad_id = self._pad_id()
        noised = uniform_canvas(canvas.tokens, free, n_support, pad_id, generators)
        result = sample_uniform(self.model, noised, free, config, generators, pad_id)
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

    # ---- helpers

    def _ids(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Token ids of each prompt; texts are encoded in one batch."""
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list of prompts, not one string")
        texts = [p for p in prompts if isinstance(p, str)]
        if texts and self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; pass token ids or one")
        encoded = iter(self.tokenizer.encode_batch(texts) if texts else [])
        return [next(encoded) if isinstance(p, str) else [int(t) for t in p] for p in prompts]

    def _bos_id(self) -> int:
        return self._eos_id()  # <|endoftext|> opens every training row

    def _eos_id(self) -> int:
        if self.eos_id is None:
            raise ValueError("no EOS id: give a tokenizer or eos_id (it is also the BOS id)")
        return self.eos_id

    def _pad_id(self) -> int:
        if self.pad_id is None:
            raise ValueError("eos='stop' needs a padding id: give a tokenizer or pad_id")
        return self.pad_id
