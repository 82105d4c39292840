"""The exact output distribution of the Eso-LM sampler (eval.synthetic.exact.eso): positive
controls with the true conditional, a closed form for one all-at-once step, and the trained
network's q against the sampler's own draws."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch

from dllm.canvas import Canvas
from dllm.eso.sampler import EsoSamplerConfig, reveal_plan, sample_eso
from eval.synthetic.exact.eso import (
    conditional_predict,
    eso_distribution,
    network_predict,
    walk_order,
)
from eval.synthetic.exact.outcomes import divergences
from shared.model import ModelConfig, Transformer
from shared.sampling import SamplingConfig

BOS, MASK = 0, 4  # symbols 1..3


def total_variation(p, q) -> float:
    return divergences(q, p)["tv"]


def language(seed: int = 0, length: int = 4) -> dict[tuple[int, ...], float]:
    """Every row of ``length`` symbols after BOS, with probabilities from a Dirichlet draw."""
    rows = [(BOS, *row) for row in itertools.product((1, 2, 3), repeat=length)]
    probs = np.random.default_rng(seed).dirichlet(np.full(len(rows), 0.3))
    return {row: float(p) for row, p in zip(rows, probs)}


def exact_q(p, steps: int, alpha_0: float, length: int = 4):
    canvas = (BOS, *[MASK] * length)
    predict = conditional_predict(p, canvas, MASK)
    return eso_distribution(predict, EsoSamplerConfig(steps=steps), alpha_0, canvas, MASK)


@pytest.mark.parametrize(("steps", "alpha_0"), [(1, 0.0), (4, 1.0), (2, 0.5)])
def test_the_true_conditional_one_position_at_a_time_is_exact(steps, alpha_0):
    # alpha_0 = 0: all left to right; 4 steps for 4 positions: one per step; at alpha_0 = 0.5
    # and 2 steps the diffusion phase reveals 2 positions one per step, then the AR phase
    p = language()
    assert total_variation(p, exact_q(p, steps, alpha_0)) < 1e-12


def test_one_step_for_every_position_draws_each_from_its_marginal():
    p = language(seed=1)
    marginals = [Counter() for _ in range(4)]
    for row, mass in p.items():
        for i, token in enumerate(row[1:]):
            marginals[i][token] += mass
    product = {row: math.prod(marginals[i][t] for i, t in enumerate(row[1:])) for row in p}
    q = exact_q(p, steps=1, alpha_0=1.0)
    assert total_variation(q, product) < 1e-12
    assert total_variation(p, q) > 0.05  # the joint dependence the sampler misses


def test_two_positions_per_step_lies_between_one_step_and_one_per_step():
    p = language(seed=2)
    errors = [total_variation(p, exact_q(p, steps, 1.0)) for steps in (1, 2, 4)]
    assert errors[0] > errors[1] > errors[2] >= 0 and errors[2] < 1e-12


def sharp_model(seed: int = 0) -> Transformer:
    """A small random backbone with its output scaled up, so its predictions depend strongly on
    what it sees and a wrong conditioning order shows in q."""
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=MASK + 1, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48,
        max_seq_len=8,
    )  # fmt: skip
    model = Transformer(config).double().eval()
    with torch.no_grad():
        model.output.weight.mul_(40.0)
    return model


def test_the_networks_q_matches_the_samplers_own_draws():
    model, length, n = sharp_model(), 3, 6000
    canvas = (BOS, *[MASK] * length)
    config = EsoSamplerConfig(steps=1)
    q = eso_distribution(network_predict(model, canvas, MASK), config, 2 / 3, canvas, MASK)
    assert abs(sum(q.values()) - 1) < 1e-12
    rows = Canvas(torch.tensor([canvas] * n), MASK)
    generators = [torch.Generator().manual_seed(seed) for seed in range(n)]
    drawn = sample_eso(model, config, rows, 2 / 3, generators).tokens
    counts = Counter(tuple(row) for row in drawn.tolist())
    # the sampler draws tokens below [MASK]; the network's q has every row it can reach
    assert set(counts) <= set(q)
    for row, mass in q.items():
        observed = counts.get(row, 0) / n
        assert abs(observed - mass) <= 5 * math.sqrt(mass * (1 - mass) / n) + 2 / n, row
    # and the test can tell: q of another setting (all left to right) is far from the draws
    other = eso_distribution(network_predict(model, canvas, MASK), config, 0.0, canvas, MASK)
    empirical = {row: c / n for row, c in counts.items()}
    assert total_variation(empirical, other) > 3 * total_variation(empirical, q)


class Recorder(torch.nn.Module):
    """The network, recording the tokens and RoPE positions of every forward."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model, self.config, self.calls = model, model.config, []

    def forward(self, tokens, attention, output_mask=None, positions=None, **rest):
        self.calls.append((tokens.tolist(), positions.tolist(), attention))
        return self.model(tokens, attention, output_mask, positions=positions, **rest)


@pytest.mark.parametrize(("steps", "alpha_0"), [(1, 2 / 3), (3, 1.0), (1, 1 / 3)])
def test_each_order_is_walked_with_the_forwards_the_sampler_makes(steps, alpha_0):
    # greedy draws leave the order as the only randomness: the program's walk of the very order
    # a row drew must make the sampler's own forwards (its recomputing reference path: the
    # clean tokens in the order they became clean, then the chunk's queries) and give its row
    model, canvas = sharp_model(1), (BOS, MASK, MASK, MASK)
    greedy = EsoSamplerConfig(steps=steps, sampling=SamplingConfig(temperature=0.0))
    rows = Canvas(torch.tensor([canvas]), MASK)
    for seed in range(6):
        sampler, program = Recorder(model), Recorder(model)
        drawn = sample_eso(
            sampler, greedy, rows, alpha_0, [torch.Generator().manual_seed(seed)], kv_cache=False
        )
        plan, chunks = reveal_plan(
            rows.masked, alpha_0, steps, [torch.Generator().manual_seed(seed)]
        )
        order = plan[0].tolist()
        (tokens,) = walk_order(network_predict(program, canvas, MASK), greedy, order, chunks)
        assert drawn.tokens[0, order].tolist() == list(tokens)
        assert program.calls == sampler.calls
