"""Autoregressive generation with a preallocated KV cache.

One prefill forward writes the whole prompt batch into a ``KVCache`` (optionally in chunks, each
attending to the slots already filled), then every decode step feeds one token per row and reads
the cached keys and values of everything before it. Prompts of different lengths are left-padded:
padding slots are marked invalid in the cache so no token attends to them, and each row gets its
own RoPE positions counted from its first real token, so a row in a ragged batch computes exactly
what it would compute alone.

Rows stop independently, on EOS, on a stop token sequence or a stop string, or after
``max_new_tokens``. A finished row keeps riding along in the batch (its slot in the cache is
preallocated anyway) but its tokens are no longer recorded; generation ends when every row is done.

Decoding controls come from ``shared.sampling`` (greedy at temperature 0, temperature, top-k,
top-p, min-p, repetition penalty over the prompt, BOS included as transformers does, and the
tokens generated so far), with draws in float64 from a seeded ``torch.Generator``. Each step
draws one uniform per row from that generator, so a seeded sample depends on the batch it ran
in; greedy output does not. ``use_cache=False`` recomputes the full sequence every step: slow,
but the reference the cached path is tested against.

The loop itself, its buffers and the stop bookkeeping live in ``arlm.decoding``; the config and
result types in ``arlm.generation_types`` (both importable from here).

Prompts given as text become ``[eos_id] + tokenizer.encode(text)``: sequences in this project
start with ``<|endoftext|>`` acting as BOS, as the model saw in training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from arlm.decoding import _Decoder
from arlm.generation_types import GenerationConfig, GenerationResult, StepOutput
from shared.checkpoint import load_model_from_checkpoint
from shared.model import Transformer
from shared.tokenizer import Tokenizer

# the public API of AR generation, re-exported types included
__all__ = [
    "ARGenerator",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStream",
    "StepOutput",
    "check_ar_objective",
    "check_prompts",
    "encode_prompt",
    "generate",
]

# ---------------------------------------------------------------- input checks


def check_ar_objective(state: dict) -> None:
    """Refuse checkpoints not trained with the autoregressive objective."""
    objective = state.get("objective")
    if objective != "ar":
        raise ValueError(
            f"checkpoint objective={objective!r}: autoregressive generation needs an 'ar' "
            "checkpoint (a masked-diffusion model samples with the diffusion samplers in dllm/)"
        )


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of a text prompt, starting with BOS (= ``<|endoftext|>``) as in training."""
    return [tokenizer.eos_id, *tokenizer.encode(text)]


def check_prompts(
    prompts: Sequence[Sequence[int]], vocab_size: int, max_seq_len: int, max_new_tokens: int
) -> None:
    """Raise ValueError unless the prompt batch fits the model: at least one prompt, none empty,
    ids in the vocabulary, and the longest prompt plus max_new_tokens within max_seq_len."""
    if len(prompts) == 0:
        raise ValueError("prompts is empty: give at least one prompt")
    longest = 0
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(
                f"prompts[{i}] is empty: a prompt needs at least one token (text prompts get "
                "the BOS id automatically)"
            )
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"prompts[{i}] holds token id {bad}, outside [0, {vocab_size})")
        longest = max(longest, len(prompt))
    if longest > max_seq_len:
        raise ValueError(
            f"prompt length {longest} exceeds the model's max_seq_len={max_seq_len}; shorten "
            "the prompt"
        )
    if longest + max_new_tokens > max_seq_len:
        raise ValueError(
            f"prompt length {longest} + max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_seq_len={max_seq_len}; lower max_new_tokens to at most "
            f"{max_seq_len - longest}"
        )


# ---------------------------------------------------------------- the engine


class ARGenerator:
    """Generation engine around one autoregressive ``Transformer``.

    ``tokenizer`` is optional: without it prompts must be token ids, there is no text output
    and no stop strings; ``eos_id``/``pad_id`` then default to none / 0.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer | None = None,
        *,
        eos_id: int | None = None,
        pad_id: int | None = None,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.eos_id = eos_id if eos_id is not None else getattr(tokenizer, "eos_id", None)
        pad = pad_id if pad_id is not None else getattr(tokenizer, "pad_id", None)
        self.pad_id = 0 if pad is None else pad  # any valid id: padding is masked out
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> ARGenerator:
        """Load a training checkpoint (or the newest valid one under a run directory)."""
        model, tokenizer, state = load_model_from_checkpoint(Path(path), device)
        check_ar_objective(state)
        return cls(model, tokenizer)

    # ---- public entry points

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        config: GenerationConfig | None = None,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        on_step: Callable[[StepOutput], None] | None = None,
    ) -> GenerationResult:
        """Generate for a batch of prompts (texts or token-id lists); ``on_step`` is called
        after every step with what it produced. ``seed`` builds the generator when none is
        given (without either, draws come from torch's global RNG)."""
        decoder = self._decoder(prompts, config, generator, seed)
        steps = decoder.run(stream=on_step is not None)
        while True:
            try:
                step = next(steps)
            except StopIteration as end:
                return end.value
            on_step(step)

    def stream(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        config: GenerationConfig | None = None,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> GenerationStream:
        """An iterator of ``StepOutput``, one per step; its ``result`` is set at the end.

        The inputs are checked here, before the first step, so errors surface at the call."""
        return GenerationStream(self._decoder(prompts, config, generator, seed))

    def _decoder(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        config: GenerationConfig | None,
        generator: torch.Generator | None,
        seed: int | None,
    ) -> _Decoder:
        config = (config or GenerationConfig()).validate()
        ids = self._prompt_ids(prompts)
        cfg = self.model.config
        check_prompts(ids, cfg.vocab_size, cfg.max_seq_len, config.max_new_tokens)
        if config.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode text; pass one")
        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(seed)
        return _Decoder(self, ids, config, generator)

    def _prompt_ids(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list of prompts, not one string")
        ids = []
        for prompt in prompts:
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("text prompts need a tokenizer; pass token ids or one")
                ids.append(encode_prompt(self.tokenizer, prompt))
            else:
                ids.append([int(t) for t in prompt])
        return ids


def generate(
    model: Transformer,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    config: GenerationConfig | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    on_step: Callable[[StepOutput], None] | None = None,
) -> GenerationResult:
    """One-call form of ``ARGenerator(model, tokenizer, eos_id=...).generate(...)``."""
    engine = ARGenerator(model, tokenizer, eos_id=eos_id)
    return engine.generate(prompts, config, generator=generator, seed=seed, on_step=on_step)


class GenerationStream:
    """Iterates over the steps of one generation; ``result`` holds the ``GenerationResult``
    once the iteration is over."""

    def __init__(self, decoder: _Decoder):
        self._decoder = decoder
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[StepOutput]:
        self.result = yield from self._decoder.run(stream=True)
