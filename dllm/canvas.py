"""What a diffusion sampler starts from and what it hands back: a canvas of fixed tokens and
``[MASK]`` slots, and the EOS policy applied to the finished canvas.

Every row starts with BOS (``tokenizer.eos_id``) at position 0, as in training. A conditional
generation row is ``[BOS] + prompt + [MASK] * gen_length`` (optionally ``+ suffix``); an infilling
row fixes any set of positions (a prefix, a suffix, spans in the middle) and masks the rest.
Samplers only ever write to masked slots, so fixed tokens come back unchanged.

``[MASK]`` is the one extra vocabulary row the diffusion objectives add after the tokenizer's ids
(``mask_token_id``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from shared.tokenizer import Tokenizer

EOS_POLICIES = ("stop", "pad", "none")


@dataclass(frozen=True)
class Canvas:
    """``tokens`` [B, L] (int64) with ``mask_id`` at every position the sampler must fill."""

    tokens: torch.Tensor
    mask_id: int

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    @property
    def masked(self) -> torch.Tensor:
        return self.tokens == self.mask_id

    @property
    def condition(self) -> torch.Tensor:
        """Fixed positions a guidance pass hides: every fixed token except BOS at position 0,
        which the model saw unmasked in every training row."""
        fixed = ~self.masked
        fixed[:, 0] = False
        return fixed

    @property
    def region(self) -> tuple[int, int]:
        """[start, end): from the first to the last masked column of any row. Blocks tile this
        span left to right; fixed tokens inside it simply stay as they are."""
        columns = self.masked.any(0).nonzero().flatten()
        if len(columns) == 0:
            return (self.length, self.length)
        return (int(columns[0]), int(columns[-1]) + 1)

    def validate(self, max_seq_len: int) -> Canvas:
        if self.tokens.dim() != 2 or self.tokens.dtype != torch.long:
            raise ValueError(
                f"canvas tokens must be an int64 tensor [batch, length]; got "
                f"{self.tokens.dtype} of shape {tuple(self.tokens.shape)}"
            )
        if self.length > max_seq_len:
            raise ValueError(
                f"canvas length {self.length} exceeds the model's max_seq_len={max_seq_len}"
            )
        if self.masked[:, 0].any():
            raise ValueError("canvas position 0 must hold BOS in every row, not [MASK]")
        if not self.masked.any():
            raise ValueError("nothing to generate: the canvas has no [MASK] position")
        bad = (self.tokens < 0) | (self.tokens > self.mask_id)
        if bad.any():
            raise ValueError(
                f"canvas token id {int(self.tokens[bad][0])} is out of range: valid ids are "
                f"0..{self.mask_id - 1}, and {self.mask_id} for [MASK]"
            )
        return self


def mask_token_id(model: nn.Module, tokenizer: Tokenizer | None = None) -> int:
    """The [MASK] id of a diffusion model: its last vocabulary row, one past the tokenizer's ids
    (the objectives add it in ``model_vocab_size``). With a tokenizer, checks that they fit."""
    vocab = model.config.vocab_size
    if tokenizer is not None and tokenizer.vocab_size != vocab - 1:
        raise ValueError(
            f"the model's vocabulary has {vocab} rows, but a diffusion model needs the "
            f"tokenizer's {tokenizer.vocab_size} ids plus one [MASK] row: is this an mdm or bd "
            "model, with its own tokenizer?"
        )
    return vocab - 1


def _check_ids(ids: Sequence[int], what: str, mask_id: int) -> None:
    for token in ids:
        if not 0 <= int(token) < mask_id:
            raise ValueError(
                f"{what} token id {token!r} is out of range: valid ids are 0..{mask_id - 1}"
            )


def prompt_canvas(
    prompts: Sequence[Sequence[int]],
    gen_length: int,
    *,
    bos_id: int,
    mask_id: int,
    max_seq_len: int,
    suffix: Sequence[int] = (),
) -> Canvas:
    """Rows ``[BOS] + prompt + [MASK] * gen_length + suffix``: without a suffix, a continuation;
    with one, the span between prompt and suffix is infilled. Prompts in one batch must have the
    same length (sample different lengths in separate calls: no padding, so no row ever attends
    to anything but its own tokens)."""
    if isinstance(gen_length, bool) or not isinstance(gen_length, int) or gen_length < 1:
        raise ValueError(f"gen_length={gen_length!r} must be a positive integer")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: give at least one prompt (an empty list [] is fine)")
    lengths = sorted({len(p) for p in prompts})
    if len(lengths) > 1:
        raise ValueError(
            f"prompts in one batch must have the same length; got lengths {lengths}: "
            "sample them in separate calls"
        )
    total = 1 + lengths[0] + gen_length + len(suffix)
    if total > max_seq_len:
        with_suffix = f" + suffix of {len(suffix)} tokens" if suffix else ""
        raise ValueError(
            f"prompt of {lengths[0]} tokens + BOS + gen_length={gen_length}{with_suffix} is "
            f"{total} positions, more than the model's max_seq_len={max_seq_len}"
        )
    for prompt in prompts:
        _check_ids(prompt, "prompt", mask_id)
    _check_ids(suffix, "suffix", mask_id)
    tail = [int(t) for t in suffix]
    rows = [[bos_id, *map(int, p)] + [mask_id] * gen_length + tail for p in prompts]
    return Canvas(torch.tensor(rows, dtype=torch.long), mask_id)


def infill_canvas(
    length: int,
    fixed: Mapping[int, int] | Sequence[Mapping[int, int]],
    *,
    bos_id: int,
    mask_id: int,
    max_seq_len: int,
) -> Canvas:
    """Rows of ``length`` positions: BOS at 0, ``fixed[position] = token`` kept, the rest masked.

    ``fixed`` is one mapping (one row) or a sequence of mappings (one per row).
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length={length!r} must be an integer >= 2 (BOS plus one position)")
    if length > max_seq_len:
        raise ValueError(f"length={length} exceeds the model's max_seq_len={max_seq_len}")
    rows = [fixed] if isinstance(fixed, Mapping) else list(fixed)
    if not rows:
        raise ValueError("fixed is empty: give one mapping per row")
    tokens = torch.full((len(rows), length), mask_id, dtype=torch.long)
    tokens[:, 0] = bos_id
    for row, spec in enumerate(rows):
        for position, token in spec.items():
            if not 1 <= int(position) < length:
                raise ValueError(
                    f"infill position {position!r} is out of range: valid positions are "
                    f"1..{length - 1} (position 0 holds BOS)"
                )
            _check_ids([token], "infill", mask_id)
            tokens[row, int(position)] = int(token)
    return Canvas(tokens, mask_id)


def check_eos_policy(policy: str) -> str:
    if policy not in EOS_POLICIES:
        raise ValueError(f"eos policy {policy!r} is unknown; valid policies: {EOS_POLICIES}")
    return policy


def apply_eos_policy(
    tokens: torch.Tensor,
    region: tuple[int, int],
    policy: str,
    *,
    eos_id: int | None,
    pad_id: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, lengths) after the EOS policy, applied inside the generation ``region`` only
    (``stop`` needs both ids, ``pad`` the EOS id, ``none`` neither).

    ``stop``: the first generated EOS ends the sample, as it ends AR decoding: it and everything
        after it become ``pad_id``, and ``lengths`` counts the tokens before it.
    ``pad``: the row keeps its full length, but everything after the first EOS becomes EOS (the
        tail reads as EOS padding); ``lengths`` is the full region length.
    ``none``: tokens are returned as drawn; ``lengths`` is the full region length.
    """
    check_eos_policy(policy)
    start, end = region
    generated = tokens[:, start:end]
    full = torch.full((tokens.shape[0],), end - start, dtype=torch.long)
    if policy == "none":
        return tokens, full
    is_eos = generated == eos_id
    # after_eos[b, i]: some EOS sits at or before i
    after_eos = is_eos.cumsum(-1) > 0
    out = tokens.clone()
    if policy == "stop":
        out[:, start:end] = generated.masked_fill(after_eos, pad_id)
        return out, (~after_eos).sum(-1)
    out[:, start:end] = generated.masked_fill(after_eos, eos_id)
    return out, full
