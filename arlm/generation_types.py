"""What a generation is asked for and what it gives back: ``GenerationConfig``, the
``StepOutput`` of every streamed step, and the ``GenerationResult`` of a batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.sampling import SamplingConfig


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate and when to stop.

    max_new_tokens: tokens generated per row at most (0 returns empty rows).
    sampling: the decoding controls (``SamplingConfig(temperature=0)`` is greedy).
    stop_on_eos: end a row when it emits the EOS id.
    stop_sequences: token-id sequences that end a row once its generated tokens end with one.
    stop_strings: texts that end a row once its generated text contains one (needs a tokenizer).
    use_cache: False recomputes the whole sequence every step (reference and benchmark path).
    prefill_chunk_size: feed the prompt in chunks of this many tokens (0 = one forward).
    return_logits: keep every step's raw logits in the result (memory B x steps x vocab).
    """

    max_new_tokens: int = 64
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_on_eos: bool = True
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    stop_strings: tuple[str, ...] = ()
    use_cache: bool = True
    prefill_chunk_size: int = 0
    return_logits: bool = False

    def validate(self) -> GenerationConfig:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be an integer >= 0")
        if not _is_int(self.prefill_chunk_size) or self.prefill_chunk_size < 0:
            raise ValueError(
                f"prefill_chunk_size={self.prefill_chunk_size!r} must be an integer >= 0 "
                "(0 = the whole prompt in one forward)"
            )
        self.sampling.validate()
        for sequence in self.stop_sequences:
            if not sequence or not all(_is_int(t) and t >= 0 for t in sequence):
                raise ValueError(
                    f"stop_sequences entry {sequence!r} must be a non-empty sequence of "
                    "token ids >= 0"
                )
        for text in self.stop_strings:
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop_strings entry {text!r} must be a non-empty string")
        return self


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class StepOutput:
    """What one decode step produced, for streaming.

    tokens[i]: the id row i emitted this step, or None when the row had already finished.
    texts[i]: the new text of row i that is now final (text that a stop string or stop sequence
        might still remove is held back until it is settled); None without a tokenizer. Joining
        a row's texts over all steps gives exactly ``GenerationResult.texts[i]``.
    finished[i]: row i is done (at this step or before).
    """

    step: int
    tokens: list[int | None]
    texts: list[str] | None
    finished: list[bool]


@dataclass
class GenerationResult:
    """Generated tokens, text and statistics of one batch.

    tokens[i]: every id row i generated, including the EOS or stop tokens that ended it.
    texts[i]: the decoded generated text without the matched stop string or stop sequence
        (EOS has no text); None without a tokenizer.
    finish_reasons[i]: "eos", "stop" (a stop sequence or string) or "length".
    forward_passes: model forwards run (prefill chunks + decode steps).
    prefill_s: prompt forward(s) and the first token; decode_s: every later step.
    """

    tokens: list[list[int]]
    texts: list[str] | None
    finish_reasons: list[str]
    prompt_lengths: list[int]
    forward_passes: int
    prefill_s: float
    decode_s: float
    logits: torch.Tensor | None = None

    @property
    def new_tokens(self) -> int:
        return sum(len(row) for row in self.tokens)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens of all rows per second of prefill plus decode."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second of the decode steps alone (the first token of a row comes from
        the prefill, so it is left out here)."""
        decoded = self.new_tokens - sum(1 for row in self.tokens if row)
        return decoded / self.decode_s if self.decode_s > 0 else 0.0
