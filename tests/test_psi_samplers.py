"""Psi-samplers of the uniform-state family (dllm/uniform/sampler.py): kappa = 1 is the
ancestral sampler token for token (against the ancestral loop written out here), the kappa
schedules and the loop time profile of ``psi_plan``, the loop keeps the data marginal with the
exact denoiser, and bad knobs named in one line."""

import pytest
import torch
from torch import nn

from dllm.remdm import loop_alpha
from dllm.sampler import row_generators
from dllm.uniform.objective import alpha, support_ids, support_index
from dllm.uniform.sampler import (
    UniformSamplerConfig,
    posterior,
    psi_plan,
    sample_uniform,
    uniform_canvas,
)
from shared.sampling import sample_categorical

N, PAD, BOS = 5, 5, 0  # support ids 0..4 (id 5 is padding, outside the support)
VOCAB = N + 1


class NeighbourModel(nn.Module):
    """Logits that depend on the left neighbour, the token itself and the time."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.left = torch.randn(VOCAB, VOCAB, generator=g) * 2
        self.here = torch.randn(VOCAB, VOCAB, generator=g)
        self.config = type("C", (), {"vocab_size": VOCAB})()

    def forward(self, tokens, attention="bidirectional", output_mask=None, time=None):
        left = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)
        out = self.left[left] + self.here[tokens] + time[:, None, None]
        out[..., PAD] = -1e9
        return out if output_mask is None else out[output_mask]


def setup(rows: int, seed: int):
    tokens = torch.full((rows, 7), BOS)
    free = torch.zeros(rows, 7, dtype=torch.bool)
    free[:, 1:] = True
    generators = row_generators(torch.Generator().manual_seed(seed), rows)
    return uniform_canvas(tokens, free, N, PAD, generators), free, generators


def ancestral_reference(model, canvas, free, steps, generators):
    """The ancestral sampler written out: step k from t = k/steps to s = (k-1)/steps, z_s drawn
    from the posterior with x_theta in place of x, each row from its own generator."""
    tokens = canvas.clone()
    support = support_ids(torch.arange(N), PAD)
    for k in range(steps, 0, -1):
        t, s = k / steps, (k - 1) / steps
        logits = model(tokens, output_mask=free, time=torch.full((len(tokens),), t))[:, support]
        x_theta = torch.softmax(logits.double(), -1)
        probs = posterior(x_theta, support_index(tokens[free], PAD), t, s)
        rows = probs.split(free.sum(1).tolist())
        chosen = torch.cat([sample_categorical(p, g) for p, g in zip(rows, generators)])
        tokens[free] = support_ids(chosen, PAD)
    return tokens


@pytest.mark.parametrize(
    "options", [{}, {"corrector": 1.0}, {"psi": "cap", "eta": 0.0}, {"psi": "rescale"}]
)
def test_kappa_one_is_the_ancestral_sampler_token_for_token(options):
    model = NeighbourModel()
    canvas, free, generators = setup(16, seed=3)
    config = UniformSamplerConfig(steps=6, **options)
    assert [kappa for _, _, kappa in psi_plan(config)] == [1.0] * 6
    result = sample_uniform(model, canvas, free, config, generators, PAD)
    _, _, fresh = setup(16, seed=3)
    assert torch.equal(result.tokens, ancestral_reference(model, canvas, free, 6, fresh))


def test_a_psi_schedule_changes_the_samples():
    model = NeighbourModel()
    runs = []
    for options in ({}, {"psi": "cap", "eta": 0.3}, {"psi": "loop", "eta": 0.05}):
        canvas, free, generators = setup(16, seed=3)
        config = UniformSamplerConfig(steps=10, t_on=0.6, t_off=0.2, **options)
        runs.append(sample_uniform(model, canvas, free, config, generators, PAD).tokens)
    assert not torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def alphas(t, s):
    return [float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s)]


def test_the_cap_and_rescale_schedules():
    cap = psi_plan(UniformSamplerConfig(steps=4, psi="cap", eta=0.1))
    t, s, kappa = cap[1]  # t = 0.75, s = 0.5
    a_t, a_s = alphas(t, s)
    assert kappa == pytest.approx(1 - min(0.1, (1 - a_s) / a_t) / (1 - a_s))
    rescale = psi_plan(UniformSamplerConfig(steps=4, psi="rescale", eta=0.5))
    t, s, kappa = rescale[2]  # t = 0.5, s = 0.25
    a_t, a_s = alphas(t, s)
    assert kappa == pytest.approx(1 - 0.5 * min(1, (1 - a_s) / a_t) / (1 - a_s))
    assert cap[-1][2] == rescale[-1][2] == 1.0  # the last step, to s = 0
    window = psi_plan(UniformSamplerConfig(steps=4, corrector=0.5, t_on=0.6, t_off=0.3))
    assert [kappa for _, _, kappa in window] == [1.0, 1.0, 0.5, 1.0]


def test_the_loop_time_profile():
    # held at alpha 0.9 from t = 0.7 to 0.3: the model's time there (0.1) is outside that window
    config = UniformSamplerConfig(steps=10, psi="loop", eta=0.02, t_on=0.7, t_off=0.3)
    plan = psi_plan(config)
    grid = [(1 - k / 10, 1 - (k + 1) / 10) for k in range(10)]
    for (t, s, kappa), (g_t, g_s) in zip(plan, grid):
        a_t, a_s = alphas(t, s)
        if g_s > 0:  # the model's alpha at the step's times is the loop's alpha (clipped at 1)
            assert a_s == pytest.approx(loop_alpha(round(g_s, 12), 0.7, 0.3, 0.9))
        held = 0.3 - 1e-9 <= g_s and g_t <= 0.7 + 1e-9 and g_s > 0
        assert (t == s) == held
        assert kappa == (pytest.approx(1 - 0.02 / 0.1) if held else 1.0)
    assert plan[-1][1] == 0.0


class ConstantModel(nn.Module):
    """The exact denoiser of a language whose tokens are independent draws from ``pi``."""

    def __init__(self, pi):
        super().__init__()
        self.logits = torch.cat([pi.log(), torch.tensor([-1e9], dtype=pi.dtype)])
        self.config = type("C", (), {"vocab_size": VOCAB})()

    def forward(self, tokens, attention="bidirectional", output_mask=None, time=None):
        out = self.logits.expand(*tokens.shape, VOCAB)
        return out if output_mask is None else out[output_mask]


def test_with_the_exact_denoiser_the_loop_keeps_the_data_marginal():
    pi = torch.tensor([0.4, 0.1, 0.2, 0.25, 0.05], dtype=torch.float64)
    canvas, free, generators = setup(3000, seed=1)
    config = UniformSamplerConfig(steps=8, psi="loop", eta=0.08, t_on=0.6, t_off=0.2)
    tokens = sample_uniform(ConstantModel(pi), canvas, free, config, generators, PAD).tokens
    counts = torch.bincount(support_index(tokens[:, 1:].flatten(), PAD), minlength=N)
    expected = counts.sum() * pi
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 23.0, counts  # 4 degrees of freedom: p < 1.5e-4


@pytest.mark.parametrize("options, match", [
    ({"psi": "cap", "eta": -0.1}, r"eta=-0.1 is out of range for psi cap: valid \[0, 1\]"),
    ({"psi": "loop", "eta": 0.2}, r"eta=0.2 is out of range for psi loop: valid \[0, 0.1\]"),
    ({"t_on": 0.2, "t_off": 0.4}, r"t_on=0.2, t_off=0.4 are out of range: valid 0 <= t_off"),
    ({"psi": "loop", "alpha_on": 0.0}, r"alpha_on=0.0 is out of range: valid \(0, 1\)"),
    ({"psi": "wild"}, r"psi='wild' is unknown"),
])  # fmt: skip
def test_bad_psi_knobs_are_one_line(options, match):
    with pytest.raises(ValueError, match=match):
        UniformSamplerConfig(steps=4, **options).validate()
