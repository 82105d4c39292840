"""Losses against exact values: log V for a uniform AR model, and the MDM NELBO by enumeration."""

import itertools
import math

import pytest
import torch
from exact_mdm import TableDenoiser, exact_nelbo, true_posterior_denoiser

from dllm.masked.objective import MaskedDiffusionObjective
from dllm.noise import stratified_times
from dllm.schedules import CosineSchedule, LinearSchedule, get_schedule
from shared.config import ModelConfig
from shared.model import Transformer
from shared.objective import build_objective, loss_positions

PAD = 99  # never appears in these rows, so every position >= 1 is scored


def test_ar_loss_of_uniform_model_is_log_vocab_and_ignores_padding():
    vocab = 37
    model = Transformer(
        ModelConfig(
            vocab_size=vocab,
            dim=16,
            n_layers=1,
            n_heads=2,
            n_kv_heads=2,
            hidden_dim=32,
            max_seq_len=16,
        )
    )
    with torch.no_grad():
        model.output.weight.zero_()  # every logit 0: the uniform distribution
    objective = build_objective("ar", pad_id=36)
    tokens = torch.randint(0, 36, (3, 10))
    tokens[1, 6:] = 36  # padding
    tokens[2, 3:] = 36
    out = objective.loss(model, tokens, {})
    assert int(out.n_tokens) == 9 + 5 + 2
    assert out.nats.item() / int(out.n_tokens) == pytest.approx(math.log(vocab), rel=1e-6)


def test_ar_loss_matches_manual_cross_entropy():
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            vocab_size=20,
            dim=16,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            hidden_dim=32,
            max_seq_len=16,
        )
    )
    tokens = torch.randint(0, 19, (2, 8))
    tokens[0, 5:] = 19
    out = build_objective("ar", pad_id=19).loss(model, tokens, {})
    with torch.no_grad():
        logits = model(tokens, attention="causal")
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    manual = 0.0
    for b in range(2):
        for i in range(1, 8):
            if tokens[b, i] != 19:
                manual -= float(log_probs[b, i - 1, tokens[b, i]])
    assert out.nats.item() == pytest.approx(manual, rel=1e-5)


def test_schedules_by_hand():
    t = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    linear = LinearSchedule()
    torch.testing.assert_close(linear.alpha(t), torch.tensor([0.75, 0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        linear.loss_weight(t), torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)
    )
    cosine = CosineSchedule()
    torch.testing.assert_close(
        cosine.alpha(torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)),
        torch.tensor([1.0, math.sqrt(0.5), 0.0], dtype=torch.float64),
    )
    for schedule in (linear, cosine):  # the weight is -alpha'/(1 - alpha) at every t
        expected = -schedule.alpha_derivative(t) / (1 - schedule.alpha(t))
        torch.testing.assert_close(schedule.loss_weight(t), expected)
    # the cosine weight at t = 1/2 by hand: (pi/2) sin(pi/4) / (1 - cos(pi/4))
    half = cosine.loss_weight(torch.tensor([0.5], dtype=torch.float64)).item()
    assert half == pytest.approx((math.pi / 2) * math.sqrt(0.5) / (1 - math.sqrt(0.5)))
    with pytest.raises(ValueError, match="schedule='geometric'"):
        get_schedule("geometric")


def test_stratified_times_cover_every_stratum():
    t = stratified_times(8, torch.Generator().manual_seed(3), eps=1e-3)
    assert t.min() >= 1e-3 and t.max() <= 1.0
    strata = ((t - 1e-3) / (1 - 1e-3) * 8).floor().long()
    assert sorted(strata.tolist()) == list(range(8))


@pytest.mark.parametrize(
    "schedule, estimator", [("linear", "time"), ("cosine", "time"), ("linear", "count")]
)
def test_mdm_loss_estimator_is_unbiased(schedule, estimator):
    vocab, row = 3, [0, 2, 1, 0]
    model = TableDenoiser(vocab, len(row))
    objective = MaskedDiffusionObjective(pad_id=PAD, schedule=schedule, estimator=estimator)
    objective.model_vocab_size(vocab)
    # The time estimator draws t from [t_eps, 1]; the count estimator has no cut-off.
    t_low = 1e-3 if estimator == "time" else 0.0
    exact = exact_nelbo(model, row, vocab, objective.schedule, t_low) / (len(row) - 1)
    tokens = torch.tensor([row] * 2000)
    means = []
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        noise = objective.sample_noise(len(tokens), len(row), generator)
        out = objective.loss(model, tokens, noise)
        means.append(float(out.nats) / int(out.n_tokens))
    mean = sum(means) / len(means)
    stderr = (sum((m - mean) ** 2 for m in means) / (len(means) - 1) / len(means)) ** 0.5
    assert abs(mean - exact) < 4 * stderr + 1e-9, (mean, exact, stderr)
    assert stderr < 0.02 * exact  # the test has the power to see a small bias


def test_linear_nelbo_closed_form_matches_integral():
    """With alpha_t = 1 - t and t ~ U[0, 1] the NELBO is sum_M CE(M) / (|M| C(n, |M|))."""
    vocab, row = 3, [0, 1, 2, 2]
    model = TableDenoiser(vocab, len(row), seed=1)
    n = len(row) - 1
    closed = 0.0
    for pattern in itertools.product([False, True], repeat=n):
        masked = [i + 1 for i, m in enumerate(pattern) if m]
        if not masked:
            continue
        noised = torch.tensor([vocab if i in masked else tok for i, tok in enumerate(row)])
        log_probs = torch.log_softmax(model.table[model.index(noised)][:, :vocab].double(), -1)
        ce = -sum(float(log_probs[i, row[i]]) for i in masked)
        closed += ce / (len(masked) * math.comb(n, len(masked)))
    assert exact_nelbo(model, row, vocab, LinearSchedule(), 0.0) == pytest.approx(closed, rel=1e-6)


def test_nelbo_bounds_the_true_nll_for_the_data_distribution():
    vocab = 3
    g = torch.Generator().manual_seed(5)
    weights = torch.rand(vocab**3, generator=g, dtype=torch.float64) + 0.05
    weights /= weights.sum()
    probs = {x: float(w) for x, w in zip(itertools.product(range(vocab), repeat=3), weights)}
    optimal = true_posterior_denoiser(probs, vocab)
    perturbed = TableDenoiser(
        vocab,
        4,
        table=optimal.table.clamp(min=-30) + 0.5 * torch.randn(optimal.table.shape, generator=g),
    )
    entropy, optimal_nelbo, perturbed_nelbo = 0.0, 0.0, 0.0
    for x, p in probs.items():
        nelbo = exact_nelbo(optimal, [0, *x], vocab, LinearSchedule(), 0.0)
        # A bound for every string; for the exact posterior every unmasking order is an exact
        # chain rule, so the bound is tight.
        assert nelbo >= -math.log(p) - 1e-6
        assert nelbo == pytest.approx(-math.log(p), abs=1e-6)
        entropy -= p * math.log(p)
        optimal_nelbo += p * nelbo
        perturbed_nelbo += p * exact_nelbo(perturbed, [0, *x], vocab, LinearSchedule(), 0.0)
    assert optimal_nelbo >= entropy - 1e-6
    assert perturbed_nelbo > entropy + 0.01  # any other denoiser pays for its error


def test_nelbo_is_exact_for_a_single_token():
    """With one content position the only unmasking order is trivial: NELBO = -log p(x)."""
    probs = {(0,): 0.2, (1,): 0.5, (2,): 0.3}
    model = true_posterior_denoiser(probs, 3)
    for x, p in probs.items():
        assert exact_nelbo(model, [0, *x], 3, CosineSchedule(), 0.0) == pytest.approx(-math.log(p))


def test_mdm_never_masks_bos_or_padding_and_uses_mask_id():
    objective = MaskedDiffusionObjective(pad_id=7)
    objective.model_vocab_size(8)
    tokens = torch.tensor([[0, 1, 2, 3, 7, 7], [0, 4, 5, 6, 1, 2]])
    noise = {
        "t": torch.tensor([1.0, 1.0], dtype=torch.float64),
        "uniforms": torch.zeros(2, 6, dtype=torch.float64),
    }
    noised, masked, weight = objective.noise_rows(tokens, noise)
    assert torch.equal(masked, loss_positions(tokens, 7))
    assert torch.equal(noised[masked], torch.full((int(masked.sum()),), 8))
    assert torch.equal(noised[~masked], tokens[~masked])
    torch.testing.assert_close(weight, torch.tensor([1.0, 1.0], dtype=torch.float64))


def test_mdm_model_never_predicts_mask():
    """SUBS: making the [MASK] logit huge changes nothing, since it is dropped from the softmax."""
    vocab, row = 3, [0, 2, 1, 0]
    model = TableDenoiser(vocab, len(row))
    objective = MaskedDiffusionObjective(pad_id=PAD)
    objective.model_vocab_size(vocab)
    tokens = torch.tensor([row] * 16)
    noise = objective.sample_noise(16, 4, torch.Generator().manual_seed(0))
    before = objective.loss(model, tokens, noise).nats
    model.table[..., vocab] = 1e4
    assert float(objective.loss(model, tokens, noise).nats) == pytest.approx(float(before))


def test_count_estimator_masks_exactly_k_loss_positions():
    objective = MaskedDiffusionObjective(pad_id=7, estimator="count")
    objective.model_vocab_size(8)
    tokens = torch.tensor([[0, 1, 2, 3, 4, 7, 7], [0, 4, 5, 6, 1, 2, 3]])
    noise = objective.sample_noise(2, 7, torch.Generator().manual_seed(1))
    noise["t"] = torch.tensor([0.5, 1.0], dtype=torch.float64)
    _, masked, weight = objective.noise_rows(tokens, noise)
    assert masked.sum(-1).tolist() == [2, 6]  # ceil(0.5 * 4), ceil(1.0 * 6)
    assert not (masked & ~loss_positions(tokens, 7)).any()
    torch.testing.assert_close(weight, torch.tensor([2.0, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="estimator='count'.*linear"):
        MaskedDiffusionObjective(pad_id=7, estimator="count", schedule="cosine")


def test_padded_protocol_noises_padding_so_the_length_is_modelled():
    """With pad_is_data the padding is masked and predicted like text (otherwise visible padding
    would give the model each row's length for free and the NELBO would bound -log p(x | length),
    not -log p(x)); the per-token denominator still counts real tokens only."""
    vocab, pad = 4, 3
    row = [0, 1, pad, pad]
    model = TableDenoiser(vocab, len(row), seed=4)
    objective = MaskedDiffusionObjective(pad_id=pad, pad_is_data=True)
    objective.model_vocab_size(vocab)
    noise = {
        "t": torch.tensor([1.0], dtype=torch.float64),
        "uniforms": torch.zeros(1, 4, dtype=torch.float64),
    }
    _, masked, _ = objective.noise_rows(torch.tensor([row]), noise)
    assert masked.tolist() == [[False, True, True, True]]
    exact = exact_nelbo(model, row, vocab, objective.schedule, objective.t_eps)
    tokens = torch.tensor([row] * 2000)
    generator = torch.Generator().manual_seed(0)
    means = []
    for _ in range(20):
        out = objective.loss(model, tokens, objective.sample_noise(len(tokens), 4, generator))
        assert int(out.n_tokens) == len(tokens)  # one real token per row
        means.append(float(out.nats) / len(tokens))
    mean = sum(means) / len(means)
    stderr = (sum((m - mean) ** 2 for m in means) / (len(means) - 1) / len(means)) ** 0.5
    assert abs(mean - exact) < 4 * stderr + 1e-9
