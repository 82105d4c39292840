"""The entropy-bounded (EB) sampler (dllm/strategies.py): gamma = 0 reveals one token per step
(greedy, the fixed low-confidence sampler at one token per step, token for token), the revealed
set is the rule's by enumeration of the sets ordered by the predictions' confidence (not the
drawn tokens'), larger gamma reveals more per step, and a bad gamma is one line."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dllm.block.sampler import sample_blocks
from dllm.canvas import Canvas
from dllm.masked.sampler import sample
from dllm.sampler import SamplerConfig
from dllm.strategies import EntropyBounded, FixedCount, StepContext
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig

GEN = 16


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def eb_model():
    torch.manual_seed(1)
    config = ModelConfig(
        vocab_size=9, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=64, max_seq_len=17
    )
    return Transformer(config).eval()


def canvas(batch: int = 3) -> Canvas:
    return Canvas(torch.tensor([[0] + [8] * GEN] * batch), mask_id=8)


def test_gamma_zero_reveals_one_token_per_step_as_the_fixed_sampler(eb_model):
    # greedy: the drawn token is the most likely one, so both rules rank alike
    greedy = SamplingConfig(temperature=0.0)
    eb = sample(eb_model, SamplerConfig(EntropyBounded(0.0), sampling=greedy), canvas(), seeded(4))
    fixed = sample(eb_model, SamplerConfig(FixedCount(GEN), sampling=greedy), canvas(), seeded(4))
    assert eb.revealed.tolist() == [[1] * 3] * GEN
    assert torch.equal(eb.tokens, fixed.tokens)


def test_gamma_zero_in_the_block_family(eb_model):
    result = sample_blocks(eb_model, SamplerConfig(EntropyBounded(0.0)), canvas(), 4, seeded(0))
    assert result.revealed.tolist() == [[1] * 3] * GEN


def test_a_larger_budget_takes_fewer_steps(eb_model):
    steps = [
        sample(eb_model, SamplerConfig(EntropyBounded(gamma)), canvas(), seeded(4)).steps
        for gamma in (0.0, 1.0, 4.0, 1e9)
    ]
    assert steps[0] == GEN and steps == sorted(steps, reverse=True) and steps[-1] == 1


class PerPosition(nn.Module):
    """Fixed logits per position (its rows: ``logits`` [L, V]), the [MASK] row never predicted."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.table = torch.cat([logits, torch.full((len(logits), 1), -1e9)], dim=-1)
        self.config = SimpleNamespace(vocab_size=logits.shape[1] + 1, max_seq_len=len(logits))

    def forward(self, tokens, attention, output_mask=None, **unused):
        out = self.table.expand(tokens.shape[0], -1, -1)
        return out if output_mask is None else out[output_mask]


def rule_by_enumeration(probs, tokens, masked, gamma) -> set[int]:
    """Every confidence-ordered set (the k masked positions whose predictions' largest
    probability is highest, k = 1..n), the largest whose summed entropy minus its largest is
    <= gamma; the top one at least. ``tokens`` (what was drawn) must not matter."""
    positions = [i for i in range(len(masked)) if masked[i]]
    confidence = {i: float(probs[i].max()) for i in positions}
    order = sorted(positions, key=lambda i: (-confidence[i], i))
    entropy = {i: -sum(float(p) * math.log(p) for p in probs[i] if p > 0) for i in positions}
    best = {order[0]}
    for k in range(1, len(order) + 1):
        chosen = order[:k]
        if sum(entropy[i] for i in chosen) - max(entropy[i] for i in chosen) <= gamma:
            best = set(chosen)
    return best


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.8, 1.5, 3.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_revealed_set_is_the_rule_by_enumeration(gamma, seed):
    g = seeded(seed)
    length, vocab = 6, 4
    logits = torch.randn(length, vocab, generator=g, dtype=torch.float64) * 2.5
    masked = torch.rand(length, generator=g) < 0.8
    masked[0] = True
    ctx = StepContext(
        index=0,
        steps=None,
        masked=masked[None],
        masked_at_start=masked.sum()[None],
        logits=logits[None],
        sampling=SamplingConfig(),
        generators=[seeded(seed + 10)],
    )
    reveal, tokens = EntropyBounded(gamma).step(ctx)
    expected = rule_by_enumeration(ctx.probs[0], tokens[0], masked.tolist(), gamma)
    assert set(reveal[0].nonzero().flatten().tolist()) == expected


@pytest.mark.parametrize("gamma", [-0.1, float("nan"), float("inf")])
def test_a_bad_gamma_is_one_line(gamma):
    with pytest.raises(ValueError, match=r"gamma=.* is out of range: valid gamma >= 0 \(finite\)"):
        SamplerConfig(EntropyBounded(gamma)).validate()
