"""The diffusion generation engine: the counterpart of ``arlm.generate.ARGenerator``.

    generator = DiffusionGenerator.from_checkpoint("runs/demo/mdm")
    result = generator.generate(["In the beginning"], 64, SamplerConfig(FixedCount(64)), seed=0)
    result.texts, result.tokens, result.nfe, result.raw.revealed

The generator owns the whole chain from prompts to text, so no caller wires it up again:

- the family (``dllm.families``), looked up by the checkpoint's objective: it gives the id that
  marks the positions to generate ([MASK] for the masked and block families: the model's last
  vocabulary row) and the sampler (``dllm.masked``: semi-autoregressive blocks of any length;
  ``dllm.block``: the training block grid, exact KV cache of the finished blocks;
  ``dllm.uniform``: ancestral steps through the uniform-state posterior). An ancestral rule
  without a schedule steps under the schedule the model was trained with
  (``dllm.sampler.with_model_schedule``);
- the canvas: ``[BOS] + prompt + [MASK] * gen_length``, optionally ``+ suffix`` (infilling), or
  any set of fixed positions (``infill_canvas``); prompts are texts or token ids;
- the EOS policy (``dllm.canvas.apply_eos_policy``) and decoding.

Randomness is that of the samplers: ``seed`` becomes ``torch.Generator().manual_seed(seed)``, from
which each row's stream is derived (``dllm.sampler.row_generators``); pass ``generator`` (one,
or one per row) to control the streams yourself. The same seed gives the same tokens as calling
the samplers directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm.canvas import (
    Canvas,
    apply_eos_policy,
    check_eos_policy,
    infill_canvas,
    prompt_canvas,
)
from dllm.families import Generators, SampleRequest, family_names, family_of, spoken_names

# with_model_schedule lived here before dllm.sampler; scripts may still import it from here
from dllm.sampler import SampleResult, with_model_schedule  # noqa: F401
from shared.checkpoint import load_model_from_checkpoint
from shared.model import Transformer
from shared.tokenizer import Tokenizer

Prompt = str | Sequence[int]


def settings_of_families() -> str:
    """The sampler settings each family takes: "mdm model with SamplerConfig, ..."."""
    return ", ".join(
        f"{name} model with {family_of(name).config_type.__name__}" for name in family_names()
    )


def objective_of(state: Mapping[str, Any], source: str = "the checkpoint") -> str:
    """The run's diffusion objective (one with a registered family); refuses anything else."""
    objective = state.get("objective")
    if objective not in family_names():
        raise ValueError(
            f"{source} was trained with objective {objective!r}: diffusion generation needs an "
            f"{spoken_names()} checkpoint (an autoregressive model generates with "
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
    """Generation engine around one diffusion ``Transformer`` of any registered family.

    ``state``: the checkpoint's saved state; its "objective" picks the family (and so the
    sampler) and its "train_config" gives the noise schedule and (bd) the block size. None means
    an mdm model trained under the linear schedule.
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
        self.family = family_of(self.objective)
        self.mask_id = self.family.generation_id(model, tokenizer)
        self.eos_id = eos_id if eos_id is not None else getattr(tokenizer, "eos_id", None)
        self.pad_id = pad_id if pad_id is not None else getattr(tokenizer, "pad_id", None)
        self.block_size = self.family.block_size(self.state)

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
        every position of the training-grid blocks that cover it for a bd model (the family's
        ``decoded_positions``)."""
        return self.family.decoded_positions(canvas, self.state)

    # ---- sampling

    def generate(
        self,
        prompts: Sequence[Prompt],
        gen_length: int,
        config: Any,
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
        config: Any,
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
        config: Any,
        generator: Generators,
        *,
        kv_cache: bool,
        stop_id: int | None,
    ) -> SampleResult:
        """The sampler of this model's family (see the module docstring); ``stop_id``: the EOS
        id a sampler that can stop early stops after (None: decode the whole canvas)."""
        if not isinstance(config, self.family.config_type):
            raise ValueError(
                f"a {self.objective!r} model cannot sample with {type(config).__name__}: each "
                f"family takes its own settings ({settings_of_families()})"
            )
        request = SampleRequest(
            model=self.model,
            state=self.state,
            canvas=canvas,
            config=config,
            generator=generator,
            kv_cache=kv_cache,
            stop_id=stop_id,
            pad_id=self.pad_id,
        )
        return self.family.sample(request)

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
