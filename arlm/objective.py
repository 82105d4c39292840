"""Next-token prediction: the exact negative log-likelihood in nats per token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.objective import LossOutput, loss_positions


class AutoregressiveObjective:
    name = "ar"
    attention = "causal"
    metric = "nll"

    def __init__(self, *, pad_id: int):
        self.pad_id = pad_id

    def model_vocab_size(self, tokenizer_vocab_size: int) -> int:
        return tokenizer_vocab_size

    def sample_noise(
        self, n_rows: int, seq_len: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        return {}  # deterministic objective

    def loss(
        self, model: nn.Module, tokens: torch.Tensor, noise: dict[str, torch.Tensor]
    ) -> LossOutput:
        # Position i predicts token i+1, so the last position has nothing to predict and is not fed.
        targets = tokens[:, 1:]
        scored = loss_positions(tokens, self.pad_id)[:, 1:]
        logits = model(tokens[:, :-1], attention=self.attention, output_mask=scored)
        nats = F.cross_entropy(logits.float(), targets[scored], reduction="sum")
        return LossOutput(nats=nats, n_tokens=scored.sum())
