"""Decoding controls of shared/sampling.py on hand-made logits, and the statistics of the draws:
the exact surviving sets of top-k, top-p and min-p, the repetition penalty's values, greedy at
temperature 0, seeded reproducibility, a chi-square test against the softmax, and a float64
precision check that a float32 Gumbel draw fails."""

import math

import pytest
import torch
from scipy import stats

from arlm.decoding import choose_tokens
from shared.sampling import (
    SamplingConfig,
    apply_repetition_penalty,
    min_p_filter,
    process_logits,
    sample_categorical,
    sample_from_logits,
    top_k_filter,
    top_p_filter,
)

# probabilities 0.5, 0.2, 0.15, 0.1, 0.05, shuffled so sorting matters
PROBS = torch.tensor([0.15, 0.5, 0.05, 0.2, 0.1], dtype=torch.float64)
LOGITS = PROBS.log()


def survivors(filtered: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(filtered)).flatten().tolist())


@pytest.mark.parametrize(
    "k, expected",
    [(1, {1}), (2, {1, 3}), (3, {0, 1, 3}), (0, {0, 1, 2, 3, 4}), (9, {0, 1, 2, 3, 4})],
)
def test_top_k_keeps_the_k_largest(k, expected):
    assert survivors(top_k_filter(LOGITS, k)) == expected


def test_top_k_keeps_ties_at_the_boundary():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0])
    assert survivors(top_k_filter(logits, 2)) == {1, 3}
    assert survivors(top_k_filter(logits, 3)) == {1, 2, 3, 4}


@pytest.mark.parametrize(
    "p, expected",
    [
        (0.3, {1}),  # 0.5 alone reaches 0.3
        (0.6, {1, 3}),  # 0.5 < 0.6 <= 0.7
        (0.8, {0, 1, 3}),  # 0.7 < 0.8 <= 0.85
        (0.9, {0, 1, 3, 4}),  # 0.85 < 0.9 <= 0.95
        (0.99, {0, 1, 2, 3, 4}),
        (1.0, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    assert survivors(top_p_filter(LOGITS, p)) == expected


@pytest.mark.parametrize(
    "min_p, expected",
    [
        (0.5, {1}),  # threshold 0.25
        (0.35, {1, 3}),  # threshold 0.175
        (0.25, {0, 1, 3}),  # threshold 0.125
        (0.15, {0, 1, 3, 4}),  # threshold 0.075
        (0.0, {0, 1, 2, 3, 4}),
    ],
)
def test_min_p_drops_tokens_below_a_fraction_of_the_top(min_p, expected):
    assert survivors(min_p_filter(LOGITS, min_p)) == expected


def test_filters_act_per_row_and_leave_survivors_unchanged():
    logits = torch.stack([LOGITS, LOGITS.roll(1)])  # row 1: every token one place later
    for filtered in (
        top_k_filter(logits, 2),
        top_p_filter(logits, 0.6),
        min_p_filter(logits, 0.35),
    ):
        assert survivors(filtered[0]) == {1, 3} and survivors(filtered[1]) == {2, 4}
    filtered = top_k_filter(logits, 2)
    kept = torch.isfinite(filtered)
    assert torch.equal(filtered[kept], logits[kept])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 0.0]])
    seen = torch.tensor([[True, True, False, False, True]])
    penalised = apply_repetition_penalty(logits, seen, 2.0)
    assert penalised.tolist() == [[1.0, -2.0, 0.5, -3.0, 0.0]]
    assert apply_repetition_penalty(logits, seen, 1.0) is logits


def test_process_logits_penalises_then_scales_then_filters():
    logits = torch.tensor([[4.0, 2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, False, True, False]])
    config = SamplingConfig(temperature=0.5, top_k=3, repetition_penalty=2.0)
    out = process_logits(logits, config, seen)
    assert out.dtype == torch.float64
    # penalty: [2, 2, -4, 1]; / 0.5: [4, 4, -8, 2]; top-3 drops -8
    assert out.tolist() == [[4.0, 4.0, float("-inf"), 2.0]]


def test_temperature_zero_is_the_argmax():
    torch.manual_seed(0)
    logits = torch.randn(64, 100)
    config = SamplingConfig(temperature=0, top_k=5, top_p=0.3, min_p=0.5)
    expected = logits.argmax(-1)
    assert torch.equal(sample_from_logits(logits, config, torch.Generator()), expected)
    assert torch.equal(choose_tokens(logits, SamplingConfig(temperature=0), None, None), expected)


def test_a_fixed_seed_reproduces_the_draws():
    torch.manual_seed(0)
    logits = torch.randn(32, 100)
    config = SamplingConfig(temperature=1.3, top_p=0.9)

    def draw(seed: int) -> torch.Tensor:
        return sample_from_logits(logits, config, torch.Generator().manual_seed(seed))

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.7, top_k=4),
        SamplingConfig(temperature=1.4, top_p=0.8),
        SamplingConfig(min_p=0.1),
    ],
)
def test_draws_follow_the_softmax_of_the_processed_logits(config):
    """Chi-square goodness of fit of 20,000 draws against the expected probabilities, which
    are computed independently: softmax of logits / T over the survivors of the filter."""
    logits = torch.tensor([2.0, 1.5, 0.3, -0.2, 1.0, -1.5])
    n = 20_000
    draws = sample_from_logits(logits.expand(n, -1), config, torch.Generator().manual_seed(1234))
    scaled = logits.double() / config.temperature
    keep = torch.ones(6, dtype=torch.bool)
    order = scaled.argsort(descending=True)
    probs = torch.softmax(scaled, -1)
    if config.top_k:
        keep[order[config.top_k :]] = False
    if config.top_p < 1:
        before = probs[order].cumsum(0) - probs[order]
        keep[order[before >= config.top_p]] = False
    if config.min_p:
        keep &= probs >= config.min_p * probs.max()
    expected = torch.where(keep, probs, 0.0)
    expected = expected / expected.sum()
    counts = torch.bincount(draws, minlength=6).double()
    assert counts[~keep].sum() == 0  # filtered tokens are never drawn
    result = stats.chisquare(counts[keep].numpy(), (expected[keep] * n).numpy())
    assert result.pvalue > 1e-3, (counts, expected * n)


def test_float64_draws_resolve_probabilities_below_float32_resolution():
    """One token holds 127/128 of the mass; 2^19 others share 1/128, each with probability
    2^-26, below float32's resolution near 1 (2^-24). The mean surprisal -log p(x) of exact
    draws estimates the entropy without bias (E[-log p(X)] = H); it must match H.

    A float32 Gumbel-max draw fails this: its noise is capped near 16.6 (uniforms cannot get
    closer to 1 than 2^-24) while a tail token needs to beat the head by 18 nats, so it picks
    the tail about 25 times too rarely. Swapped in for ``sample_categorical`` here, it gave a
    mean surprisal of 0.012 nats against H = 0.149 (tolerance 0.1): 1 tail draw, not about 32."""
    tail, log2_p = 2**19, 26
    probs = torch.full((tail + 1,), 2.0**-log2_p, dtype=torch.float64)
    probs[0] = 1 - tail * 2.0**-log2_p
    surprisal = -probs.log()
    entropy = float((probs * surprisal).sum())
    spread = math.sqrt(float((probs * surprisal**2).sum()) - entropy**2)
    n = 4096
    generator = torch.Generator().manual_seed(0)
    # one CDF per draw (a 4 MB row stays in cache; a batch of rows would not); written into a
    # preallocated tensor, as a growing list of tensors makes the garbage collector crawl
    draws = torch.empty(n, dtype=torch.long)
    for i in range(n):
        draws[i] = sample_categorical(probs, generator)
    mean = float(surprisal[draws].mean())
    assert abs(mean - entropy) < 4 * spread / math.sqrt(n), (mean, entropy)
    # and the tail really was drawn, about n / 128 = 32 times
    assert 10 <= int((draws > 0).sum()) <= 60
