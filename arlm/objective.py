"""Next-token prediction: the exact negative log-likelihood in nats per token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.objective import LossOutput, loss_positions, register_objective, sum_per_row


@register_objective
class AutoregressiveObjective:
    name = "ar"
    attention = "causal"
    metric = "nll"
    streams = 1  # rows through the network per data row (FLOP budgets count each)

    def __init__(self, *, pad_id: int):
        self.pad_id = pad_id

    @classmethod
    def options_from_config(cls, train_config: dict, *, full_noise_range: bool) -> dict:
        return {}  # nothing beyond the padding id

    @classmethod
    def check_config(cls, train_config) -> None:
        pass  # any row layout works

    def model_vocab_size(self, tokenizer_vocab_size: int) -> int:
        return tokenizer_vocab_size

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        return {}  # deterministic objective

    def loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        noise: dict[str, torch.Tensor],
        scored: torch.Tensor | None = None,
    ) -> LossOutput:
        # Position i predicts token i+1, so the last position has nothing to predict and is not fed.
        if scored is None:
            scored = loss_positions(tokens, self.pad_id)
        targets_scored = scored[:, 1:]
        logits = model(tokens[:, :-1], attention=self.attention, output_mask=targets_scored)
        token_nats = F.cross_entropy(
            logits.float(), tokens[:, 1:][targets_scored], reduction="none"
        )
        row_nats = sum_per_row(token_nats, targets_scored.nonzero()[:, 0], len(tokens))
        return LossOutput(nats=token_nats.sum(), n_tokens=scored.sum(), row_nats=row_nats)
