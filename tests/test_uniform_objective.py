"""Uniform-state diffusion (``udm``) against exact enumeration on a tiny vocabulary: the forward
process, the continuous-time NELBO as the limit of the discrete-time ELBO and a bound on the
exact NLL, an unbiased estimator, its gradient, and bad configurations."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from dllm.uniform.objective import (
    UniformDiffusionObjective,
    alpha,
    position_nelbo,
    prior_nats,
    support_ids,
    support_index,
)
from shared.errors import ConfigError
from shared.objective import build_objective

PAD = 3  # vocabulary 0..4 with padding at 3: the support is {0, 1, 2, 4}
VOCAB = 5
N = VOCAB - 1
BOS = 4
CLEAN = torch.tensor([[BOS, 1, 4]])  # BOS, then two scored tokens (support positions 1 and 3)


class PairModel(nn.Module):
    """Logits at each scored position depend on both noised tokens (so the model is not a
    product of independent positions): logits[p] = W[p, z_1] + U[p, z_2], in float64."""

    def __init__(self, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.first = nn.Parameter(
            torch.randn(3, VOCAB, VOCAB, generator=generator, dtype=torch.float64)
        )
        self.second = nn.Parameter(
            torch.randn(3, VOCAB, VOCAB, generator=generator, dtype=torch.float64)
        )

    def all_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        return self.first[positions, tokens[:, 1:2]] + self.second[positions, tokens[:, 2:3]]

    config = SimpleNamespace(vocab_size=VOCAB)

    def forward(self, tokens, attention="bidirectional", output_mask=None, time=None):
        assert attention == "bidirectional"
        logits = self.all_logits(tokens)
        return logits if output_mask is None else logits[output_mask]


def objective(t_eps: float = 1e-3) -> UniformDiffusionObjective:
    made = build_objective("udm", pad_id=PAD, t_eps=t_eps)
    assert made.model_vocab_size(VOCAB) == VOCAB and made.n_support == N
    return made


SUPPORT = support_ids(torch.arange(N), PAD)
STATES = torch.cartesian_prod(SUPPORT, SUPPORT)  # every noised pair (z_1, z_2), as token ids


def x_theta(model: PairModel) -> torch.Tensor:
    """[states, 2, N]: the model's distribution over the support at both scored positions."""
    rows = torch.cat([torch.full((len(STATES), 1), BOS), STATES], dim=1)
    return model.all_logits(rows)[:, 1:][..., SUPPORT].softmax(-1).detach()


def forward_marginal(t: float, clean: torch.Tensor) -> torch.Tensor:
    """q(z_t = j | x) over the support for each clean support index: [len(clean), N]."""
    a = float(alpha(torch.tensor(t, dtype=torch.float64)))
    return a * nn.functional.one_hot(clean, N).double() + (1 - a) / N


CLEAN_INDEX = support_index(CLEAN[0, 1:], PAD)  # support positions of the two scored tokens


def state_probability(t: float) -> torch.Tensor:
    """q(z_t = state | x) for every state of the two scored positions: [states]."""
    marginal = forward_marginal(t, CLEAN_INDEX)
    index = support_index(STATES, PAD)
    return marginal[0, index[:, 0]] * marginal[1, index[:, 1]]


def exact_continuous_nelbo(model: PairModel, low: float = 0.0, points: int = 400) -> float:
    """prior + integral over [low, 1] of E_{z_t ~ q}[sum of L_t], by Gauss-Legendre quadrature."""
    nodes, weights = np.polynomial.legendre.leggauss(points)
    theta = x_theta(model).log()
    index = support_index(STATES, PAD)
    total = 0.0
    for node, weight in zip(nodes, weights):
        t = low + (1 - low) * (node + 1) / 2
        times = torch.full((len(STATES),), t, dtype=torch.float64)
        per_state = sum(
            position_nelbo(theta[:, p], CLEAN_INDEX[p].repeat(len(STATES)), index[:, p], times)
            for p in range(2)
        )
        total += weight * (1 - low) / 2 * float((state_probability(t) * per_state).sum().detach())
    return 2 * prior_nats(N) + total


def reverse_step(t: float, s: float, theta: torch.Tensor) -> torch.Tensor:
    """p(z_s = j | z_t) at each position of each state, with x_theta for x: [states, 2, N]."""
    a_t, a_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
    a_ts = a_t / a_s
    stay = nn.functional.one_hot(support_index(STATES, PAD), N).double()
    numerator = (a_ts * stay + (1 - a_ts) / N) * (a_s * theta + (1 - a_s) / N)
    return numerator / numerator.sum(-1, keepdim=True)


def discrete_elbo_and_nll(model: PairModel, steps: int) -> tuple[float, float]:
    """(-ELBO, -log p(x)) of the ``steps``-step model, both exact by enumeration."""
    theta = x_theta(model)
    index = support_index(STATES, PAD)
    clean = nn.functional.one_hot(CLEAN_INDEX, N).double()
    negative_elbo = 2 * prior_nats(N)
    marginal = torch.full((len(STATES),), 1.0 / len(STATES), dtype=torch.float64)
    for k in range(steps, 0, -1):
        t, s = k / steps, (k - 1) / steps
        model_step = reverse_step(t, s, theta)
        a_t, a_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
        stay = nn.functional.one_hot(index, N).double()
        true = ((a_t / a_s) * stay + (1 - a_t / a_s) / N) * (a_s * clean + (1 - a_s) / N)
        true = true / true.sum(-1, keepdim=True)
        kl = (torch.xlogy(true, true) - torch.xlogy(true, model_step)).sum(-1).sum(-1)
        negative_elbo += float((state_probability(t) * kl).sum().detach())
        # one step of the generative chain: state -> state, a product over the two positions
        move = model_step[:, 0, index[:, 0]] * model_step[:, 1, index[:, 1]]
        marginal = marginal @ move
    at_x = (index == CLEAN_INDEX).all(-1)
    return negative_elbo, -math.log(float(marginal[at_x]))


def test_support_skips_padding_both_ways():
    ids = torch.tensor([0, 1, 2, 4])
    assert torch.equal(support_index(ids, PAD), torch.tensor([0, 1, 2, 3]))
    assert torch.equal(support_ids(support_index(ids, PAD), PAD), ids)


def test_forward_process_keeps_bos_and_draws_from_the_support_only():
    made = objective()
    rows = 20000
    tokens = CLEAN.repeat(rows, 1)
    generator = torch.Generator().manual_seed(0)
    noise = made.sample_noise(rows, 3, generator)
    noise["t"] = torch.full((rows,), 0.6, dtype=torch.float64)
    scored = torch.tensor([[False, True, True]]).repeat(rows, 1)
    noised = made.noise_rows(tokens, noise, scored)
    assert (noised[:, 0] == BOS).all() and not (noised == PAD).any()
    expected = forward_marginal(0.6, CLEAN_INDEX)
    for p in range(2):
        counts = torch.bincount(support_index(noised[:, p + 1], PAD), minlength=N).double()
        chi2 = float(((counts - rows * expected[p]) ** 2 / (rows * expected[p])).sum())
        assert chi2 < 16.3, (p, counts)  # chi-square, 3 degrees of freedom, p = 0.001


def test_the_position_nelbo_is_zero_for_the_true_distribution():
    t = torch.tensor([0.01, 0.3, 0.99], dtype=torch.float64)
    clean = torch.tensor([2, 0, 1])
    log_true = nn.functional.one_hot(clean, N).double().log()
    for noised in (clean, torch.tensor([0, 0, 3])):
        assert position_nelbo(log_true, clean, noised, t).abs().max() < 1e-12


def test_continuous_nelbo_is_the_limit_of_the_discrete_elbo_and_bounds_the_nll():
    for seed in (0, 1):
        model = PairModel(seed)
        continuous = exact_continuous_nelbo(model)
        negative_elbo, nll = discrete_elbo_and_nll(model, steps=1000)
        assert abs(continuous - negative_elbo) < 1e-3 * continuous, (continuous, negative_elbo)
        assert nll <= negative_elbo and nll < continuous, (nll, negative_elbo, continuous)
        # and the discrete ELBO tightens as steps are added (coarse chains bound more loosely)
        assert discrete_elbo_and_nll(model, steps=50)[0] >= negative_elbo - 1e-9


def test_the_estimator_is_unbiased():
    model, made = PairModel(3), objective(t_eps=1e-3)
    rows = 4000
    noise = made.sample_noise(rows, 3, torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = made.loss(model, CLEAN.repeat(rows, 1), noise)
    assert int(out.n_tokens) == 2 * rows
    estimates = out.row_nats
    # t ~ U[1e-3, 1]: its mean is the integral over [1e-3, 1] divided by the interval
    integral = exact_continuous_nelbo(model, low=1e-3) - 2 * prior_nats(N)
    exact = 2 * prior_nats(N) + integral / (1 - 1e-3)
    standard_error = float(estimates.std()) / math.sqrt(rows)
    assert abs(float(estimates.mean()) - exact) < 4 * standard_error, (estimates.mean(), exact)
    assert float(out.nats) == pytest.approx(float(estimates.sum()), rel=1e-9)


def test_the_gradient_of_the_position_nelbo_matches_finite_differences():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(4, N, generator=generator, dtype=torch.float64, requires_grad=True)
    clean, noised = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 2, 2, 1])
    t = torch.tensor([0.05, 0.4, 0.7, 0.95], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: position_nelbo(x.log_softmax(-1), clean, noised, t), (logits,)
    )


def test_bad_configurations_name_what_fits():
    from shared.training.config import TrainConfig

    with pytest.raises(ConfigError, match="padding is not in its support.*--protocol packed"):
        TrainConfig(objective="udm", protocol="padded").validate()
    with pytest.raises(ConfigError, match="udm.*--schedule linear"):
        TrainConfig(objective="udm", schedule="cosine").validate()
    with pytest.raises(ValueError, match="schedule='cosine'"):
        build_objective("udm", pad_id=0, schedule="cosine")
    for field, flag in ((dict(block_size=4), "--block-size"), (dict(t_max=0.5), "--t-max")):
        with pytest.raises(ConfigError, match=f"{flag} is a block-diffusion setting"):
            TrainConfig(objective="udm", **field).validate()
    from shared.training import presets

    with pytest.raises(ConfigError, match="shift_logits is a masked-diffusion layout"):
        presets.resolve_config("tiny", {"shift_logits": True, "objective": "udm"})


# ---- the sampler --------------------------------------------------------------------------------


def test_the_posterior_is_bayes_with_x_drawn_from_x_theta():
    from dllm.uniform.sampler import posterior

    generator = torch.Generator().manual_seed(4)
    theta = torch.rand(3, N, generator=generator, dtype=torch.float64)
    theta = theta / theta.sum(-1, keepdim=True)
    noised = torch.tensor([0, 2, 3])
    for t, s in ((1.0, 0.5), (0.5, 0.2), (0.3, 0.0)):
        a_t, a_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
        eye = torch.eye(N, dtype=torch.float64)
        q_s_given_x = a_s * eye + (1 - a_s) / N  # [x, z_s]
        q_t_given_s = (a_t / a_s) * eye + (1 - a_t / a_s) / N  # [z_s, z_t]
        # joint p(x, z_s, z_t = i) with x ~ x_theta, summed over x, conditioned on z_t = i
        joint = torch.einsum("nx,xs,sn->ns", theta, q_s_given_x, q_t_given_s[:, noised])
        expected = joint / joint.sum(-1, keepdim=True)
        assert torch.allclose(posterior(theta, noised, t, s), expected, atol=1e-12)


def run_sampler(model, rows: int, steps: int, seed: int, **options):
    from dllm.sampler import row_generators
    from dllm.uniform.sampler import UniformSamplerConfig, sample_uniform, uniform_canvas

    tokens = CLEAN.repeat(rows, 1)
    free = torch.tensor([[False, True, True]]).repeat(rows, 1)
    generators = row_generators(torch.Generator().manual_seed(seed), rows)
    canvas = uniform_canvas(tokens, free, N, PAD, generators)
    config = UniformSamplerConfig(steps=steps, **options)
    return sample_uniform(model, canvas, free, config, generators, PAD)


def test_many_steps_sample_the_chains_exact_marginal():
    model, steps, rows = PairModel(5), 6, 3000
    result = run_sampler(model, rows, steps, seed=0)
    assert result.nfe == steps and (result.tokens[:, 0] == BOS).all()
    assert not (result.tokens == PAD).any()
    # the generative chain's exact marginal by enumeration (as in discrete_elbo_and_nll)
    theta = x_theta(model)
    index = support_index(STATES, PAD)
    marginal = torch.full((len(STATES),), 1.0 / len(STATES), dtype=torch.float64)
    for k in range(steps, 0, -1):
        step = reverse_step(k / steps, (k - 1) / steps, theta)
        marginal = marginal @ (step[:, 0, index[:, 0]] * step[:, 1, index[:, 1]])
    drawn = support_index(result.tokens[:, 1:], PAD)
    state = drawn[:, 0] * N + drawn[:, 1]  # STATES is (z_1, z_2) in row-major support order
    counts = torch.bincount(state, minlength=len(STATES)).double()
    expected = rows * marginal
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 37.7, (counts, expected)  # chi-square, 15 degrees of freedom, p = 0.001


def test_rows_do_not_depend_on_their_batch_and_seeds_repeat():
    model = PairModel(6)
    alone = run_sampler(model, 1, 4, seed=3).tokens
    batched = run_sampler(model, 5, 4, seed=3).tokens
    assert torch.equal(alone[0], batched[0])
    assert torch.equal(batched, run_sampler(model, 5, 4, seed=3).tokens)


def test_greedy_tail_ends_on_the_argmax_of_x_theta():
    model = PairModel(7)
    result = run_sampler(model, 50, 3, seed=1, greedy_tail=True)
    # every final canvas is a fixed point of x_theta's argmax at the position it was taken from:
    # the last step's input differs per row, so check the rule directly on one step
    from dllm.uniform.sampler import UniformSamplerConfig, sample_uniform

    free = torch.tensor([[False, True, True]]).repeat(50, 1)
    one_step = sample_uniform(
        model, result.tokens, free, UniformSamplerConfig(steps=1, greedy_tail=True),
        [torch.Generator().manual_seed(i) for i in range(50)], PAD,
    )  # fmt: skip
    logits = model.all_logits(result.tokens)[:, 1:][..., SUPPORT]
    assert torch.equal(one_step.tokens[:, 1:], support_ids(logits.argmax(-1), PAD))


def test_sampler_options_that_do_not_apply_are_refused():
    from dllm.uniform.sampler import UniformSamplerConfig
    from shared.sampling import SamplingConfig

    with pytest.raises(ValueError, match="steps=0 must be a positive integer"):
        UniformSamplerConfig(steps=0).validate()
    with pytest.raises(ValueError, match="min_p and repetition_penalty are not applied"):
        UniformSamplerConfig(steps=4, sampling=SamplingConfig(min_p=0.1)).validate()


# ---- a trained udm run through the generator and the command line -------------------------------


def test_the_generator_keeps_the_prompt_and_fills_every_free_position(udm_run):
    from dllm.generator import DiffusionGenerator
    from dllm.sampler import SamplerConfig
    from dllm.strategies import FixedCount
    from dllm.uniform.sampler import UniformSamplerConfig

    generator = DiffusionGenerator.from_checkpoint(udm_run)
    vocab = generator.model.config.vocab_size
    assert generator.objective == "udm" and generator.mask_id == vocab
    config = UniformSamplerConfig(steps=5)
    prompts = ["And God", "In thee"]
    result = generator.generate(prompts, 12, config, seed=3, eos="none")
    raw = result.raw
    assert raw.nfe == 5 and raw.steps == 5 and not raw.approximate
    start, end = raw.region
    assert end - start == 12 and (raw.tokens < vocab).all()
    assert not (raw.tokens[:, start:end] == generator.pad_id).any()
    for row, prompt in zip(raw.tokens, prompts):
        ids = generator.tokenizer.encode(prompt)
        assert row[0] == generator.eos_id and row[1 : 1 + len(ids)].tolist() == ids
    again = generator.generate(prompts, 12, config, seed=3, eos="none")
    assert torch.equal(again.raw.tokens, raw.tokens)
    with pytest.raises(ValueError, match="udm model with UniformSamplerConfig"):
        generator.generate(prompts, 12, SamplerConfig(FixedCount(4)))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--remasking", "random"], "--remasking does not apply to .* a udm"),
        (["--sampler", "threshold"], "--sampler threshold does not apply to .* a udm"),
        (["--cache", "approx_prefix"], "--cache only applies to mdm checkpoints"),
        (["--steps", "0"], "steps=0 must be a positive integer"),
    ],
)
def test_sampler_flags_of_other_families_are_one_line(udm_run, flags, message, capsys):
    from dllm import sample

    assert sample.main([str(udm_run), "--gen-length", "4", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert __import__("re").search(message, err[0]), err[0]


def test_the_command_line_samples_a_udm_run(udm_run, capsys):
    import json

    from dllm import sample

    argv = [str(udm_run), "--prompt", "And", "--gen-length", "6", "--steps", "3", "--json"]
    assert sample.main([*argv, "--greedy-tail"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == "udm" and out["sampler"] == "uniform-ancestral"
    assert out["nfe"] == 3 and len(out["texts"]) == 1


# ---- time conditioning ---------------------------------------------------------------------------


def test_time_conditioning_starts_as_the_unconditioned_model_and_then_reads_each_rows_t():
    from dataclasses import replace

    from shared.config import ModelConfig
    from shared.model import Transformer

    shape = ModelConfig(vocab_size=11, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64)
    torch.manual_seed(0)
    plain = Transformer(shape)
    conditioned = Transformer(replace(shape, time_conditioning=True))
    missing, unexpected = conditioned.load_state_dict(plain.state_dict(), strict=False)
    layers = ("hidden.bias", "hidden.weight", "out.bias", "out.weight")
    assert sorted(missing) == [f"time_embedding.{name}" for name in layers]
    assert not unexpected
    tokens = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.1, 0.9])
    with torch.no_grad():
        reference = plain(tokens, "bidirectional")
        # the output layer starts at zero: the conditioned model is the unconditioned one
        assert torch.equal(conditioned(tokens, "bidirectional", time=t), reference)
        assert torch.equal(plain(tokens, "bidirectional", time=t), reference)  # no embedding
        nn.init.normal_(conditioned.time_embedding.out.weight, std=0.1)
        early = conditioned(tokens, "bidirectional", time=torch.tensor([0.1, 0.1]))
        late = conditioned(tokens, "bidirectional", time=torch.tensor([0.9, 0.9]))
        mixed = conditioned(tokens, "bidirectional", time=t)
    assert (early - late).abs().max() > 1e-3
    torch.testing.assert_close(mixed[0], early[0])  # each row reads its own t
    torch.testing.assert_close(mixed[1], late[1])
    with pytest.raises(ValueError, match="pass time="):
        conditioned(tokens, "bidirectional")
    assert "time_conditioning" not in shape.to_dict()  # configs read as before it existed
    assert replace(shape, time_conditioning=True).to_dict()["time_conditioning"] is True


def test_a_time_conditioned_run_trains_resumes_samples_and_refuses_other_objectives(tmp_path):
    from safetensors.torch import load_file

    from dllm.generator import DiffusionGenerator
    from dllm.uniform.sampler import UniformSamplerConfig
    from shared import checkpoint as ckpt
    from shared.training import cli

    cache = ["--cache-dir", str(tmp_path / "cache"), "--eval-every", "100"]
    run = tmp_path / "timed"
    argv = ["--preset", "tiny", "--objective", "udm", "--time-conditioning", "true"]
    cli.train_from_argv([*argv, "--out", str(run), "--max-steps", "4", "--stop-after-steps", "2",
                         *cache])  # fmt: skip
    cli.train_from_argv(["--resume", str(run), *cache[:2]])
    weights = load_file(str(ckpt.resolve_checkpoint(run) / "model.safetensors"))
    assert weights["time_embedding.out.weight"].abs().max() > 0  # it learned from zero
    generator = DiffusionGenerator.from_checkpoint(run)
    assert generator.model.config.time_conditioning
    result = generator.generate(["And"], 6, UniformSamplerConfig(steps=3), seed=0, eos="none")
    assert result.raw.nfe == 3

    for objective in ("ar", "mdm", "bd"):
        blocks = ["--block-size", "4"] if objective == "bd" else []
        with pytest.raises(ConfigError, match="time_conditioning feeds uniform-state diffusion"):
            cli.train_from_argv(
                ["--preset", "tiny", "--objective", objective, "--time-conditioning", "true"]
                + ["--out", str(tmp_path / objective), "--max-steps", "1", *blocks, *cache]
            )
        assert not (tmp_path / objective).exists()

    # a time embedding can be added to a udm run's weights (it starts at zero), not dropped
    plain = tmp_path / "plain"
    cli.train_from_argv(["--preset", "tiny", "--objective", "udm", "--out", str(plain),
                         "--max-steps", "1", *cache])  # fmt: skip
    added = cli.train_from_argv([*argv, "--init-from", str(plain), "--out", str(tmp_path / "a"),
                                 "--max-steps", "1", *cache])  # fmt: skip
    assert added["step"] == 1
    with pytest.raises(ConfigError, match="time_conditioning"):
        cli.train_from_argv(["--preset", "tiny", "--objective", "mdm", "--init-from", str(run),
                             "--out", str(tmp_path / "b"), "--max-steps", "1", *cache])  # fmt: skip


# ---- the predictor-corrector (Psi) step ----------------------------------------------------------


def test_the_corrector_step_mixes_the_posterior_with_the_renoised_guess():
    from dllm.uniform.sampler import corrected_step, posterior

    generator = torch.Generator().manual_seed(8)
    theta = torch.rand(3, N, generator=generator, dtype=torch.float64)
    theta = theta / theta.sum(-1, keepdim=True)
    noised = torch.tensor([1, 0, 3])
    t, s = 0.7, 0.4
    a_t, a_s = (float(alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
    # x given z_t by Bayes with x ~ theta, then noised forward to s
    likelihood = (a_t * torch.eye(N, dtype=torch.float64) + (1 - a_t) / N)[:, noised].T
    guess = theta * likelihood
    guess = guess / guess.sum(-1, keepdim=True)
    renoised = a_s * guess + (1 - a_s) / N
    for kappa in (0.0, 0.3, 1.0):
        expected = kappa * posterior(theta, noised, t, s) + (1 - kappa) * renoised
        assert torch.allclose(corrected_step(theta, noised, t, s, kappa), expected, atol=1e-12)
    assert torch.equal(corrected_step(theta, noised, t, s, 1.0), posterior(theta, noised, t, s))
    for kappa in (0.0, 0.5):  # the last step does not depend on kappa
        assert torch.allclose(
            corrected_step(theta, noised, 0.25, 0.0, kappa), posterior(theta, noised, 0.25, 0.0)
        )


class ConstantModel(nn.Module):
    """x_theta = pi at every position whatever the input: the exact denoiser of independent
    positions with marginal pi, so every sampler of the chain ends on pi exactly."""

    config = SimpleNamespace(vocab_size=VOCAB)

    def __init__(self, pi: torch.Tensor):
        super().__init__()
        logits = torch.full((VOCAB,), -1e9, dtype=torch.float64)
        logits[SUPPORT] = pi.log()
        self.logits = logits

    def forward(self, tokens, attention="bidirectional", output_mask=None, time=None):
        out = self.logits.expand(*tokens.shape, VOCAB)
        return out if output_mask is None else out[output_mask]


@pytest.mark.parametrize("kappa", [0.0, 0.4])
def test_with_the_exact_denoiser_the_corrector_keeps_the_data_marginal(kappa):
    pi = torch.tensor([0.5, 0.1, 0.3, 0.1], dtype=torch.float64)
    rows = 4000
    result = run_sampler(ConstantModel(pi), rows, 3, seed=1, corrector=kappa)
    for position in (1, 2):
        counts = torch.bincount(support_index(result.tokens[:, position], PAD), minlength=N)
        expected = rows * pi
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 20.0, (kappa, counts)  # 3 degrees of freedom: p < 2e-4


def test_kappa_one_is_the_ancestral_sampler_and_other_kappas_differ():
    model = PairModel(2)
    plain = run_sampler(model, 64, 4, seed=5)
    assert plain.tokens.shape == (64, 3)
    assert torch.equal(run_sampler(model, 64, 4, seed=5, corrector=1.0).tokens, plain.tokens)
    corrected = run_sampler(model, 64, 4, seed=5, corrector=0.2)
    assert not torch.equal(corrected.tokens, plain.tokens)
    assert (corrected.tokens[:, 0] == BOS).all() and not (corrected.tokens == PAD).any()
    from dllm.uniform.sampler import UniformSamplerConfig

    assert UniformSamplerConfig(4).name == "uniform-ancestral"
    assert UniformSamplerConfig(4, corrector=0.5).name == "uniform-psi"
    with pytest.raises(ValueError, match=r"corrector=1.5 \(kappa\) must be in \[0, 1\]"):
        UniformSamplerConfig(4, corrector=1.5).validate()


def test_the_command_line_takes_the_corrector_for_udm_only(udm_run, capsys):
    import json

    from dllm import sample

    argv = [str(udm_run), "--gen-length", "5", "--steps", "3", "--json", "--corrector", "0.5"]
    assert sample.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["sampler"] == "uniform-psi"
