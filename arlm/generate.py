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

Prompts given as text become ``[eos_id] + tokenizer.encode(text)``: sequences in this project
start with ``<|endoftext|>`` acting as BOS, as the model saw in training.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shared.model import KVCache, Transformer
from shared.sampling import SamplingConfig, sample_from_logits
from shared.tokenizer import Tokenizer

FINISH_REASONS = ("length", "eos", "stop")
_LENGTH, _EOS, _STOP = 0, 1, 2


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


# ---------------------------------------------------------------- small pure helpers


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-align ragged prompts: tokens [B, P], valid [B, P] (False on padding) and RoPE
    positions [B, P] counted from each row's first real token (padding gets 0; it is never
    attended to, so its position does not matter)."""
    width = max(len(p) for p in prompts)
    tokens = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    return tokens, valid, positions


def ends_with(generated: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    """[B] bool: whether each row of ``generated`` [B, n] ends with ``sequence`` [L]."""
    length = sequence.shape[0]
    if generated.shape[1] < length:
        return torch.zeros(generated.shape[0], dtype=torch.bool, device=generated.device)
    return (generated[:, -length:] == sequence).all(dim=-1)


def choose_tokens(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    seen: torch.Tensor | None,
) -> torch.Tensor:
    """Next ids [B] from logits [B, V]. Plain greedy is an argmax of the raw logits (exactly
    the float64 argmax, as the cast preserves order); everything else goes through
    ``shared.sampling`` in float64."""
    if sampling.greedy and seen is None:
        return logits.argmax(dim=-1)
    return sample_from_logits(logits, sampling, generator, seen)


def cut_at_stop_string(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string."""
    hits = [i for i in (text.find(s) for s in stop_strings) if i >= 0]
    return text[: min(hits)] if hits else text


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
        from shared.checkpoint import load_model_from_checkpoint

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


class _Decoder:
    """The state of one generation: buffers, cache and per-row bookkeeping, all preallocated.

    ``seq`` [B, P + N] holds the left-padded prompts followed by the generated tokens, so the
    uncached path can feed a prefix of it and the cached path one column of it, with no
    concatenation per step.
    """

    def __init__(
        self,
        engine: ARGenerator,
        prompts: list[list[int]],
        config: GenerationConfig,
        generator: torch.Generator | None,
    ):
        self.engine, self.model, self.config = engine, engine.model, config
        self.generator = generator
        self.prompt_lengths = [len(p) for p in prompts]
        device = engine.device
        tokens, valid, positions = left_pad(prompts, engine.pad_id)
        self.batch, self.width = tokens.shape
        steps = config.max_new_tokens
        total = self.width + steps
        self.padded = min(self.prompt_lengths) < self.width
        self.seq = torch.full((self.batch, total), engine.pad_id, dtype=torch.long, device=device)
        self.seq[:, : self.width] = tokens
        self.valid = torch.ones(self.batch, total, dtype=torch.bool, device=device)
        self.valid[:, : self.width] = valid
        # generated token t of a row sits at position (its prompt length + t)
        start = torch.tensor(self.prompt_lengths, device=device)[:, None]
        after = start + torch.arange(steps, device=device)
        self.positions = torch.cat([positions.to(device), after], dim=1)

        self.finished = torch.zeros(self.batch, dtype=torch.bool, device=device)
        self.every_row = torch.ones(self.batch, dtype=torch.bool, device=device)
        self.reason = torch.full((self.batch,), _LENGTH, dtype=torch.long, device=device)
        self.stop_cut = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.lengths = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.stop_seqs = [torch.tensor(s, device=device) for s in config.stop_sequences]
        self.seen = self._seen_prompt_tokens() if config.sampling.repetition_penalty != 1 else None
        self.cache = (
            KVCache(self.model.config, self.batch, total, device, engine.dtype)
            if config.use_cache
            else None
        )
        self.logits = (
            torch.zeros(self.batch, steps, self.model.config.vocab_size, device=device)
            if config.return_logits
            else None
        )
        self.stop_bytes = [s.encode("utf-8") for s in config.stop_strings]
        self.byte_tails = [bytearray() for _ in range(self.batch)] if self.stop_bytes else []
        eos_stops = config.stop_on_eos and engine.eos_id is not None
        self.can_stop = bool(eos_stops or self.stop_seqs or self.stop_bytes)
        self.forwards = 0
        self.steps_done = 0

    def _seen_prompt_tokens(self) -> torch.Tensor:
        """[B, V] bool: the ids present in each row's prompt (padding excluded)."""
        seen = torch.zeros(
            self.batch, self.model.config.vocab_size, dtype=torch.bool, device=self.seq.device
        )
        prompt, valid = self.seq[:, : self.width], self.valid[:, : self.width]
        rows = torch.arange(self.batch, device=self.seq.device)[:, None].expand_as(prompt)
        seen[rows[valid], prompt[valid]] = True
        return seen

    # ---- the loop

    def run(self, stream: bool) -> Iterator[StepOutput]:
        """Generate; with ``stream`` yield a StepOutput after every step (otherwise nothing,
        so the loop stays free of per-row Python). Returns the GenerationResult."""
        texts = _TextStreams(self) if stream and self.engine.tokenizer is not None else None
        steps = self.config.max_new_tokens
        clock = _Clock(self.engine.device)
        prefill_s = decode_s = 0.0
        for t in range(steps):
            emitted = self._step(t)
            all_done = self.can_stop and bool(self.finished.all())
            elapsed = clock.lap()
            if t == 0:
                prefill_s = elapsed
            else:
                decode_s += elapsed
            self.steps_done = t + 1
            if stream:
                last = all_done or t == steps - 1
                yield self._step_output(t, emitted, last, texts)
                clock.lap()  # time spent by the consumer of the stream is not generation time
            if all_done:
                break
        return self._result(prefill_s, decode_s)

    @torch.inference_mode()
    def _step(self, t: int) -> torch.Tensor:
        """Run the forward that yields token t of every row and choose it; returns which rows
        emitted a token."""
        logits = self._prefill() if t == 0 else self._decode_step(t)
        return self._choose(logits, t)

    def _prefill(self) -> torch.Tensor:
        """Logits [B, V] at the last prompt position."""
        width = self.width
        if self.cache is None:
            return self._uncached_forward(width)
        chunk = self.config.prefill_chunk_size or width
        last = torch.zeros(self.batch, width, dtype=torch.bool, device=self.seq.device)
        last[:, -1] = True
        logits = None
        for begin in range(0, width, chunk):
            stop = min(begin + chunk, width)
            logits = self.model(
                self.seq[:, begin:stop],
                attention="causal",
                output_mask=last[:, begin:stop],  # only the final chunk runs the output head
                positions=self.positions[:, begin:stop],
                key_valid=self.valid[:, begin:stop] if self.padded else None,
                cache=self.cache,
            )
            self.forwards += 1
        return logits

    def _decode_step(self, t: int) -> torch.Tensor:
        """Logits [B, V] after feeding generated token t-1."""
        column = self.width + t
        if self.cache is None:
            return self._uncached_forward(column)
        logits = self.model(
            self.seq[:, column - 1 : column],
            attention="causal",
            positions=self.positions[:, column - 1 : column],
            cache=self.cache,
        )
        self.forwards += 1
        return logits[:, 0]

    def _uncached_forward(self, length: int) -> torch.Tensor:
        last = torch.zeros(self.batch, length, dtype=torch.bool, device=self.seq.device)
        last[:, -1] = True
        self.forwards += 1
        return self.model(
            self.seq[:, :length],
            attention="causal",
            output_mask=last,
            positions=self.positions[:, :length],
            key_valid=self.valid[:, :length] if self.padded else None,
        )

    def _choose(self, logits: torch.Tensor, t: int) -> torch.Tensor:
        """Pick token t of every row, record it, and update which rows are done.
        Returns emitted [B]: the rows that produced a token this step."""
        if self.logits is not None:
            self.logits[:, t] = logits.float()
        chosen = choose_tokens(logits, self.config.sampling, self.generator, self.seen)
        column = self.width + t
        if not self.can_stop:  # every row runs to max_new_tokens: no bookkeeping needed
            self.seq[:, column] = chosen
            if self.seen is not None:
                self.seen.scatter_(1, chosen[:, None], True)
            return self.every_row
        emitted = ~self.finished
        chosen = chosen.masked_fill(self.finished, self.engine.pad_id)
        self.seq[:, column] = chosen
        self.lengths += emitted
        if self.seen is not None:
            self.seen.scatter_(1, chosen[:, None], True)

        ended = torch.zeros_like(self.finished)
        if self.config.stop_on_eos and self.engine.eos_id is not None:
            hit = emitted & (chosen == self.engine.eos_id)
            self.reason.masked_fill_(hit, _EOS)
            ended |= hit
        generated = self.seq[:, self.width : column + 1]
        for sequence in self.stop_seqs:
            hit = emitted & ~ended & ends_with(generated, sequence)
            self.reason.masked_fill_(hit, _STOP)
            # drop the longest matching sequence from the text
            self.stop_cut = torch.where(hit, self.stop_cut.clamp(min=len(sequence)), self.stop_cut)
            ended |= hit
        if self.stop_bytes:
            hit = emitted & ~ended & self._stop_string_hits(chosen, emitted)
            self.reason.masked_fill_(hit, _STOP)
            ended |= hit
        self.finished |= ended
        return emitted

    def _stop_string_hits(self, chosen: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
        """Match stop strings on each row's generated bytes. UTF-8 is self-synchronising, so a
        stop string occurs in the text exactly when its bytes occur in the byte stream; only
        the last (longest stop - 1) bytes need keeping between steps."""
        keep = max(len(s) for s in self.stop_bytes) - 1
        hits = [False] * self.batch
        for row, (token, active) in enumerate(zip(chosen.tolist(), emitted.tolist())):
            if not active:
                continue
            tail = self.byte_tails[row]
            tail += self.engine.tokenizer.id_to_bytes(token)
            hits[row] = any(s in tail for s in self.stop_bytes)
            del tail[: max(0, len(tail) - keep)]
        return torch.tensor(hits, device=chosen.device)

    # ---- outputs

    def _step_output(
        self, t: int, emitted: torch.Tensor, last: bool, texts: _TextStreams | None
    ) -> StepOutput:
        column = self.width + t
        active = emitted.tolist()
        ids = self.seq[:, column].tolist()
        tokens = [token if on else None for token, on in zip(ids, active)]
        # after the last step every row is done, those stopped by the length limit included
        finished = [True] * self.batch if last else self.finished.tolist()
        deltas = texts.advance(tokens, finished) if texts is not None else None
        return StepOutput(step=t, tokens=tokens, texts=deltas, finished=finished)

    def _result(self, prefill_s: float, decode_s: float) -> GenerationResult:
        lengths = self.lengths.tolist() if self.can_stop else [self.steps_done] * self.batch
        generated = self.seq[:, self.width : self.width + self.steps_done].tolist()
        tokens = [row[:n] for row, n in zip(generated, lengths)]
        reasons = [FINISH_REASONS[r] for r in self.reason.tolist()]
        texts = None
        if self.engine.tokenizer is not None:
            texts = [self.final_text(i, row, r) for i, (row, r) in enumerate(zip(tokens, reasons))]
        logits = None
        if self.logits is not None:
            logits = self.logits[:, : self.steps_done]
        return GenerationResult(
            tokens=tokens,
            texts=texts,
            finish_reasons=reasons,
            prompt_lengths=self.prompt_lengths,
            forward_passes=self.forwards,
            prefill_s=prefill_s,
            decode_s=decode_s,
            logits=logits,
        )

    def final_text(self, row: int, tokens: list[int], reason: str) -> str:
        """The text of a finished row: its tokens decoded without the stop that ended it."""
        cut = int(self.stop_cut[row])
        if reason == "stop" and cut:
            tokens = tokens[: len(tokens) - cut]
        text = self.engine.tokenizer.decode(tokens)
        if reason == "stop" and self.config.stop_strings:
            text = cut_at_stop_string(text, self.config.stop_strings)
        return text


class _TextStreams:
    """Incremental text of every row for streaming, holding back what a stop could remove.

    A stop sequence can still remove the last (longest sequence - 1) tokens and a stop string
    the last (longest string - 1) characters, so those are only released once later tokens
    push them out of reach, or when the row finishes and its final text is known.
    """

    def __init__(self, decoder: _Decoder):
        self.decoder = decoder
        config = decoder.config
        self.token_hold = max((len(s) for s in config.stop_sequences), default=1) - 1
        self.char_hold = max((len(s) for s in config.stop_strings), default=1) - 1
        batch = decoder.batch
        self.utf8 = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(batch)]
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.released = [0] * batch  # tokens fed to the UTF-8 decoder
        self.decoded = [""] * batch  # text of the released tokens
        self.sent = [""] * batch  # text handed out so far
        self.closed = [False] * batch
        self.token_bytes = decoder.engine.tokenizer.id_to_bytes

    def advance(self, tokens: list[int | None], finished: list[bool]) -> list[str]:
        deltas = []
        for row, token in enumerate(tokens):
            if self.closed[row]:
                deltas.append("")
                continue
            if token is not None:
                self.tokens[row].append(token)
            if finished[row]:
                deltas.append(self._close(row))
            else:
                deltas.append(self._release(row))
        return deltas

    def _release(self, row: int) -> str:
        settled = len(self.tokens[row]) - self.token_hold
        while self.released[row] < settled:
            token = self.tokens[row][self.released[row]]
            self.decoded[row] += self.utf8[row].decode(self.token_bytes(token))
            self.released[row] += 1
        safe = len(self.decoded[row]) - self.char_hold
        already = len(self.sent[row])
        if safe <= already:
            return ""
        delta = self.decoded[row][already:safe]
        self.sent[row] += delta
        return delta

    def _close(self, row: int) -> str:
        reason = FINISH_REASONS[int(self.decoder.reason[row])]
        final = self.decoder.final_text(row, self.tokens[row], reason)
        self.closed[row] = True
        delta = final[len(self.sent[row]) :]
        self.sent[row] = final
        return delta


class _Clock:
    """Wall-clock laps that wait for the device, so GPU timings are real."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        elapsed, self.last = now - self.last, now
        return elapsed
