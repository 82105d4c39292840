"""ReMDM (dllm/remdm.py): sigma = 0 is the ancestral sampler draw for draw, one step keeps the
forward marginal alpha, one step's kernel equals the remasking posterior of reference §17.1 by
enumeration, the schedules and the loop profile, and bad knobs named in one line."""

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dllm.block.sampler import sample_blocks
from dllm.canvas import Canvas
from dllm.masked.sampler import sample
from dllm.remdm import Remdm, loop_alpha, reveal_probability, sigma_max
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, StepContext
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig

VOCAB, MASK = 64, 64


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def remdm_model():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=VOCAB + 1,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        hidden_dim=64,
        max_seq_len=17,
    )
    return Transformer(config).eval()


def canvas(batch: int = 4, gen: int = 16) -> Canvas:
    return Canvas(torch.tensor([[0] + [MASK] * gen] * batch), mask_id=MASK)


@pytest.mark.parametrize("block_length", [None, 4])
@pytest.mark.parametrize("mode", ["constant", "cap", "rescale"])
def test_sigma_zero_is_the_ancestral_sampler_token_for_token(remdm_model, mode, block_length):
    plain = SamplerConfig(Ancestral(16, "linear"), block_length=block_length)
    remdm = SamplerConfig(Remdm(16, mode=mode, schedule="linear"), block_length=block_length)
    a = sample(remdm_model, plain, canvas(), seeded(3))
    b = sample(remdm_model, remdm, canvas(), seeded(3))
    assert torch.equal(a.tokens, b.tokens)
    assert a.nfe == b.nfe and torch.equal(a.revealed, b.revealed)


def test_sigma_zero_is_the_ancestral_sampler_in_the_block_family(remdm_model):
    plain = sample_blocks(
        remdm_model, SamplerConfig(Ancestral(20, "linear")), canvas(), 4, seeded(2)
    )
    config = SamplerConfig(Remdm(20, mode="cap", eta=0.0, schedule="linear"))
    remdm = sample_blocks(remdm_model, config, canvas(), 4, seeded(2))
    assert torch.equal(plain.tokens, remdm.tokens)


def test_a_corrector_changes_the_samples_and_leaves_no_mask(remdm_model):
    plain = sample(remdm_model, SamplerConfig(Ancestral(32, "linear")), canvas(), seeded(3))
    loop = Remdm(32, mode="loop", eta=0.05, t_on=0.6, t_off=0.1, alpha_on=0.8)
    for rule in (loop, Remdm(32, mode="cap", eta=0.05), Remdm(32, mode="conf")):
        result = sample(remdm_model, SamplerConfig(rule), canvas(), seeded(3))
        assert not (result.tokens == MASK).any()
        assert not torch.equal(result.tokens, plain.tokens), rule.mode
        assert result.tokens[:, 0].eq(0).all()  # BOS is never remasked


# ---- one step, exactly ---------------------------------------------------------------------------


class FixedPrediction(nn.Module):
    """The same x_theta at every position (the [MASK] row never predicted)."""

    def __init__(self, probs: torch.Tensor):
        super().__init__()
        self.logits = torch.cat([probs.log(), torch.tensor([-1e9], dtype=probs.dtype)])
        self.config = SimpleNamespace(vocab_size=len(probs) + 1, max_seq_len=8)

    def forward(self, tokens, attention, output_mask=None, **unused):
        out = self.logits.expand(*tokens.shape, -1).float()
        return out if output_mask is None else out[output_mask]


def posterior_formula(z_t: int, x_theta, alpha_t: float, alpha_s: float, sigma: float, m: int):
    """Reference §17.1 written out: q(z_s | z_t) over {0..V-1, m}."""
    if z_t != m:
        return {z_t: 1 - sigma, m: sigma}
    out = {
        v: float(p) * (alpha_s - (1 - sigma) * alpha_t) / (1 - alpha_t)
        for v, p in enumerate(x_theta)
    }
    out[m] = (1 - alpha_s - sigma * alpha_t) / (1 - alpha_t)
    return out


def one_step_frequencies(rule: Remdm, index: int, x_theta: torch.Tensor, z_t: int, n: int):
    """How often one step of ``rule`` takes one generated position from z_t to each state, over
    ``n`` rows with their own generators (the real step: its uniforms and its token draws)."""
    m = len(x_theta)
    ctx = StepContext(
        index=index,
        steps=rule.steps,
        masked=torch.full((n, 1), z_t == m),
        masked_at_start=torch.ones(n, dtype=torch.long),
        logits=x_theta.log().expand(n, 1, m),
        sampling=SamplingConfig(),
        generators=[seeded(row) for row in range(n)],
        generated=torch.ones(n, 1, dtype=torch.bool),
    )
    reveal, tokens, remask = rule.step(ctx)
    after = torch.where(reveal, tokens, torch.full_like(tokens, z_t)).masked_fill(remask, m)
    return Counter(after.flatten().tolist()), n


@pytest.mark.parametrize("rule, index", [
    (Remdm(8, mode="cap", eta=0.3, schedule="linear"), 3),
    (Remdm(8, mode="rescale", eta=0.5, schedule="cosine"), 5),
    (Remdm(8, mode="loop", eta=0.2, t_on=0.75, t_off=0.25, alpha_on=0.6), 3),
])  # fmt: skip
def test_one_step_enumerated_equals_the_remasking_posterior(rule, index):
    x_theta = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    rule = rule.validate()
    _, _, a_t, a_s = rule.alphas(index, rule.steps)
    sigma = rule.step_sigma(index, rule.steps)
    assert sigma > 0
    for z_t in range(4):  # three tokens and the mask: every (from, to) pair of the kernel
        formula = posterior_formula(z_t, x_theta.tolist(), a_t, a_s, sigma, 3)
        decisions = decision_kernel(rule, index, x_theta, z_t)
        counts, n = one_step_frequencies(rule, index, x_theta, z_t, 4000)
        for state in range(4):
            p = formula.get(state, 0.0)
            assert decisions.get(state, 0.0) == pytest.approx(p, abs=1e-12)
            # the real step's frequencies within five standard errors of the formula
            assert abs(counts[state] / n - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1e-12


def decision_kernel(rule: Remdm, index: int, x_theta, z_t: int) -> dict:
    """The step's kernel from the probabilities it draws against (exact): reveal or remask with
    ``reveal_probability`` / sigma, the token from x_theta."""
    _, _, a_t, a_s = rule.alphas(index, rule.steps)
    sigma = rule.step_sigma(index, rule.steps)
    m = len(x_theta)
    if z_t != m:
        return {z_t: 1 - sigma, m: sigma}
    p = reveal_probability(a_t, a_s, sigma)
    return {**{v: p * float(q) for v, q in enumerate(x_theta)}, m: 1 - p}


@pytest.mark.parametrize("alpha_t, alpha_s", [(0.2, 0.5), (0.6, 0.7), (0.0, 0.25), (0.8, 0.8)])
@pytest.mark.parametrize("share", [0.0, 0.4, 1.0])
def test_on_one_position_the_kernel_keeps_the_marginal_alpha(alpha_t, alpha_s, share):
    # A position clean with probability alpha_t (token x) is clean with probability alpha_s
    # after the step, whatever sigma in [0, sigma_max]: the sampler's own probabilities
    # (reveal_probability for a masked position, sigma for a revealed one) keep it.
    sigma = share * sigma_max(alpha_t, alpha_s)
    if alpha_t == alpha_s:  # constant alpha (the loop): only the corrector moves anything
        sigma = share * (1 - alpha_s) / alpha_s
    clean = alpha_t * (1 - sigma) + (1 - alpha_t) * reveal_probability(alpha_t, alpha_s, sigma)
    assert clean == pytest.approx(alpha_s)


def test_the_loop_profile_and_its_corrector_steps():
    assert loop_alpha(1.0, 0.5, 0.1, 0.9) == 0.0
    assert loop_alpha(0.75, 0.5, 0.1, 0.9) == pytest.approx(0.45)
    assert loop_alpha(0.3, 0.5, 0.1, 0.9) == 0.9
    assert loop_alpha(0.05, 0.5, 0.1, 0.9) == pytest.approx(0.95)
    rule = Remdm(10, mode="loop", eta=0.05, t_on=0.5, t_off=0.1, alpha_on=0.9).validate()
    sigmas = [rule.step_sigma(k, 10) for k in range(10)]
    assert sigmas == [0.0] * 5 + [0.05] * 4 + [0.0]


def test_the_schedules():
    cap = Remdm(4, mode="cap", eta=0.2, schedule="linear")
    # step 2 of 4: t = 0.5, s = 0.25, sigma_max = min(1, (1 - 0.75) / 0.5) = 0.5
    assert cap.step_sigma(2, 4) == pytest.approx(0.2)
    assert Remdm(4, mode="cap", eta=0.8, schedule="linear").step_sigma(2, 4) == 0.5
    assert cap.step_sigma(3, 4) == 0.0  # the last step reveals what is left
    rescale = Remdm(4, mode="rescale", eta=0.5, schedule="linear")
    assert rescale.step_sigma(2, 4) == pytest.approx(0.25)
    switch = Remdm(4, mode="cap", eta=0.2, t_on=0.6, schedule="linear")
    assert [switch.step_sigma(k, 4) for k in range(4)] == [0.0, 0.0, pytest.approx(0.2), 0.0]


@pytest.mark.parametrize("rule, match", [
    (Remdm(8, mode="cap", eta=-0.1), r"eta=-0.1 is out of range: valid eta >= 0"),
    (Remdm(8, mode="cap", eta=1.5), r"eta=1.5 is above its bound for mode cap: valid \[0, 1\]"),
    (Remdm(8, mode="loop", eta=0.5, t_on=0.5, t_off=0.1, alpha_on=0.9),
     r"eta=0.5 is above its bound for mode loop: valid \[0, 0.1111\]"),
    (Remdm(8, mode="loop", eta=0.01, t_on=0.1, t_off=0.5),
     r"t_on=0.1, t_off=0.5 are out of range: valid 0 <= t_off < t_on <= 1"),
    (Remdm(8, mode="loop", eta=0.01, alpha_on=1.0),
     r"alpha_on=1.0 is out of range: valid \(0, 1\)"),
    (Remdm(8, mode="constant", sigma=0.5, schedule="linear"),
     r"sigma=0.5 is above its bound sigma_max over 8 steps: valid \[0, 0.1667\]"),
    (Remdm(8, mode="wild"), r"remdm mode 'wild' is unknown"),
])  # fmt: skip
def test_bad_knobs_are_one_line(rule, match):
    with pytest.raises(ValueError, match=match):
        SamplerConfig(rule).validate()


def test_conf_remasks_the_least_confident_revealed_tokens_most():
    rule = Remdm(4, mode="conf", schedule="linear")
    revealed = torch.tensor([[True, True, False, True]])
    ctx = SimpleNamespace(memory={"psi": torch.tensor([[0.9, 0.2, 0.0, 0.5]], dtype=torch.float64)})
    sigmas = rule.token_sigmas(ctx, revealed, 0.5)
    weights = torch.softmax(-torch.tensor([0.9, 0.2, 0.5], dtype=torch.float64), 0)
    assert torch.allclose(sigmas[0, [0, 1, 3]], 0.5 * weights)
    assert sigmas[0, 2] == 0.0 and sigmas[0, 1] == sigmas.max()  # masked: never "remasked"
