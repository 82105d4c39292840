"""The confidence-threshold sampler (Fast-dLLM) against the fixed low-confidence sampler at one
token per step. Threshold(tau) reveals every masked position whose drawn token has probability
>= tau plus the most confident one; FixedCount(G) over G positions reveals only the most
confident one. So the two give identical samples exactly when no step has two positions at or
above tau (a weak model: the demo report's "threshold 0.9" rows equal "fixed low-conf 64 steps"),
and threshold decoding reveals several tokens in one step once the model is confident."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dllm.canvas import Canvas
from dllm.masked.sampler import sample
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount, Threshold
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig

VOCAB, GEN = 6, 8
MASK = VOCAB  # the last vocabulary row
HIGH = 5.0  # logit of the favoured token: exp(5) / (exp(5) + 5) = 0.967 >= 0.9


class ConstructedModel(nn.Module):
    """Logits written by hand with the Transformer's signature. Position i (1..GEN) favours
    token i % VOCAB with logit HIGH when ``confident(tokens, i)`` and is flat otherwise."""

    def __init__(self, confident):
        super().__init__()
        self.confident = confident
        self.config = SimpleNamespace(vocab_size=VOCAB + 1, max_seq_len=GEN + 1)

    def forward(self, tokens, attention, output_mask=None, **unused):
        batch, length = tokens.shape
        logits = torch.zeros(batch, length, VOCAB + 1)
        logits[..., MASK] = -1e9
        for b in range(batch):
            for i in range(1, length):
                if self.confident(tokens[b], i):
                    logits[b, i, i % VOCAB] = HIGH
        return logits if output_mask is None else logits[output_mask]


def canvas(batch: int = 3) -> Canvas:
    return Canvas(torch.tensor([[0] + [MASK] * GEN] * batch), mask_id=MASK)


def both(model, seed: int = 0, tau: float = 0.9, sampling: SamplingConfig | None = None):
    sampling = sampling or SamplingConfig()
    threshold = sample(
        model, SamplerConfig(Threshold(tau), sampling=sampling), canvas(), seed_of(seed)
    )
    fixed = sample(
        model, SamplerConfig(FixedCount(GEN), sampling=sampling), canvas(), seed_of(seed)
    )
    return threshold, fixed


def seed_of(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_a_confident_model_fills_the_canvas_in_one_step():
    model = ConstructedModel(lambda row, i: True)
    greedy = SamplingConfig(temperature=0)
    threshold, fixed = both(model, sampling=greedy)
    assert threshold.revealed.tolist() == [[GEN] * 3] and threshold.nfe == 1
    assert fixed.revealed.tolist() == [[1] * 3] * GEN and fixed.nfe == GEN
    assert torch.equal(threshold.tokens, fixed.tokens)  # greedy: the same tokens, 8x fewer steps


def test_two_confident_positions_at_once_make_the_samplers_differ():
    # Positions 1 and 5 are confident from the start; after that nothing is.
    model = ConstructedModel(lambda row, i: i in (1, 5))
    threshold, fixed = both(model, seed=3)
    assert threshold.revealed[0].tolist() == [2, 2, 2]  # both revealed in the first step
    assert threshold.steps == GEN - 1
    assert fixed.revealed[0].tolist() == [1, 1, 1]
    assert not torch.equal(threshold.tokens, fixed.tokens)  # the row streams diverge


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_confident_position_at_a_time_reduces_to_the_fixed_sampler(seed):
    # A chain: a position is confident only once its left neighbour is revealed, so at most one
    # position passes tau per step and threshold decoding is one token per step.
    model = ConstructedModel(lambda row, i: row[i - 1].item() != MASK)
    threshold, fixed = both(model, seed=seed)
    assert threshold.revealed.tolist() == [[1] * 3] * GEN
    assert torch.equal(threshold.tokens, fixed.tokens)


@pytest.mark.parametrize("seed", [0, 1])
def test_nothing_passing_reduces_to_the_fixed_sampler(seed):
    # A flat model: no position ever reaches tau, each step reveals the single most confident.
    threshold, fixed = both(ConstructedModel(lambda row, i: False), seed=seed)
    assert threshold.revealed.tolist() == [[1] * 3] * GEN
    assert torch.equal(threshold.tokens, fixed.tokens)


def test_a_random_transformer_at_tau_0_9_samples_exactly_as_fixed_one_per_step():
    # What the demo report showed, on an untrained model: confidences near 1 / vocabulary, so
    # threshold 0.9 takes one step per token and gives the fixed sampler's samples.
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            vocab_size=65,
            dim=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=4,
            hidden_dim=64,
            max_seq_len=33,
        )
    ).eval()
    start = Canvas(torch.tensor([[0] + [64] * 32] * 4), mask_id=64)
    threshold = sample(model, SamplerConfig(Threshold(0.9)), start, seed_of(5))
    fixed = sample(model, SamplerConfig(FixedCount(32)), start, seed_of(5))
    assert threshold.revealed.tolist() == [[1] * 4] * 32
    assert torch.equal(threshold.tokens, fixed.tokens)
