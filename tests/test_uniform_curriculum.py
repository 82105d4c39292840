"""Duo's Gaussian-relaxation curriculum for uniform-state diffusion (``udm``): the alpha map
against simulated latents, its limits and derivative, the soft input at small temperature, the
curriculum loss against the exact udm loss, and the switch to the exact loss (resume included)."""

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from dllm.uniform.curriculum import AlphaMap, argmax_alpha, gaussian_latents
from dllm.uniform.objective import (
    DELTA,
    alpha,
    alpha_derivative,
    nelbo_at,
    position_nelbo,
    prior_nats,
    support_ids,
    support_index,
)
from shared import checkpoint as ckpt
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.model import Transformer
from shared.objective import annealing_noise, build_objective, loss_positions, slice_noise
from shared.time_embedding import SoftInput
from shared.training.schedule import batch_generator, objective_step_noise


@pytest.mark.parametrize("n_support, gamma", [(5, -1.0), (5, 0.5), (40, -2.5), (40, -1.75)])
def test_the_argmax_of_simulated_latents_has_the_marginal_the_map_says(n_support, gamma):
    draws = 40_000
    generator = torch.Generator().manual_seed(n_support * 7 + int(10 * gamma) % 97)
    clean = torch.randint(0, n_support, (draws,), generator=generator)
    eps = torch.randn((draws, n_support), generator=generator, dtype=torch.float64)
    winner = gaussian_latents(clean, torch.full((draws,), gamma), n_support, eps).argmax(-1)
    a = float(argmax_alpha(torch.tensor(gamma), n_support)[0])
    # the clean index wins with probability alpha + (1 - alpha) / N (binomial z-score) ...
    p_clean = a + (1 - a) / n_support
    hits = int((winner == clean).sum())
    z = (hits - draws * p_clean) / math.sqrt(draws * p_clean * (1 - p_clean))
    assert abs(z) < 4.5, (hits, draws * p_clean)
    # ... and every other index equally often (chi-square over the offsets from the clean one)
    offsets = (winner - clean) % n_support
    counts = torch.bincount(offsets[offsets > 0], minlength=n_support)[1:].double()
    expected = counts.sum() / (n_support - 1)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = n_support - 2
    assert chi2 < dof + 5 * math.sqrt(2 * dof), chi2
    # an alpha a little off is caught: the test can fail
    shifted = a + 0.03
    p_wrong = shifted + (1 - shifted) / n_support
    assert abs(hits - draws * p_wrong) / math.sqrt(draws * p_wrong * (1 - p_wrong)) > 4.5


@pytest.mark.parametrize("n_support", [2, 10, 258, 50_000])
def test_the_map_is_monotone_with_the_right_limits_and_derivative(n_support):
    gamma = torch.linspace(-12.0, 12.0, 241, dtype=torch.float64)
    a, da = argmax_alpha(gamma, n_support)
    # more noise (larger gamma), less alpha: strictly wherever float64 tells values apart
    assert (a.diff() <= 0).all() and (da <= 0).all()
    inside = (a > 1e-9) & (a < 1 - 1e-9)
    assert inside.sum() > 20 and (a[inside].diff() < 0).all() and (da[inside] < 0).all()
    high, low = argmax_alpha(torch.tensor([-60.0, 60.0], dtype=torch.float64), n_support)[0]
    assert 1 - 1e-9 < float(high) <= 1 + 1e-12 and abs(float(low)) < 1e-9
    step = 1e-5
    plus, minus = argmax_alpha(gamma + step, n_support)[0], argmax_alpha(gamma - step, n_support)[0]
    torch.testing.assert_close(da, (plus - minus) / (2 * step), rtol=1e-5, atol=1e-9)


def test_the_table_reads_the_map_and_refuses_gamma_outside_it():
    table = AlphaMap(258, -3.5, -1.75)
    gamma = torch.tensor([-3.5, -3.1234, -2.0, -1.75], dtype=torch.float64)
    direct = argmax_alpha(gamma, 258)
    for read, exact in zip(table(gamma), direct):
        torch.testing.assert_close(read, exact, rtol=1e-5, atol=1e-7)
    # a reference value by independent quadrature (scipy, 258 support tokens, gamma = -1.75)
    assert abs(float(direct[0][3]) - 0.34367252379161284) < 1e-9
    assert abs(float(direct[1][3]) - -0.41603409433343647) < 1e-9
    torch.testing.assert_close(
        table.gamma(torch.tensor([0.0, 1.0])), torch.tensor([-3.5, -1.75]).double()
    )
    with pytest.raises(ValueError, match="outside the tabulated"):
        table(torch.tensor([-1.7]))


def small_model(time_conditioning: bool = False, vocab: int = 11) -> Transformer:
    shape = ModelConfig(
        vocab_size=vocab, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64,
        max_seq_len=16, time_conditioning=time_conditioning,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(shape)
    if time_conditioning:  # a live time embedding, so a wrong t would show
        torch.nn.init.normal_(model.time_embedding.out.weight, std=0.1)
    return model


def test_at_small_temperature_the_soft_input_is_the_one_hot_input_of_the_argmax():
    model, pad, vocab = small_model(), 3, 11
    n_support = vocab - 1
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, vocab, (2, 9), generator=generator)
    tokens[tokens == pad] = 0
    positions = torch.ones_like(tokens, dtype=torch.bool)
    positions[:, 0] = False  # an unscored position keeps its hard token
    count = int(positions.sum())
    latents = torch.randn((count, n_support), generator=generator)
    support = support_ids(torch.arange(n_support), pad)
    hard = tokens.clone()
    hard[positions] = support[latents.argmax(-1)]
    with torch.no_grad():
        reference = model(hard, "bidirectional")
        for tau, close in ((1e-6, True), (1.0, False)):
            soft = SoftInput(positions, torch.softmax(latents / tau, -1), support)
            logits = model(hard, "bidirectional", soft=soft)
            assert torch.allclose(logits, reference, atol=1e-5) is close


class FixedSchedule:
    """An alpha map that is the udm schedule itself (alpha(t), alpha'(t)) over gamma = t, so the
    curriculum loss can be compared with the exact loss term by term."""

    gamma_min, gamma_max = 0.0, 1.0

    def gamma(self, t):
        return t.double()

    def __call__(self, gamma):
        return alpha(gamma), alpha_derivative(gamma)


class Recorder(torch.nn.Module):
    """Passes calls to ``model`` and keeps what the last one was given."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, tokens, **kwargs):
        self.seen = SimpleNamespace(tokens=tokens.clone(), **kwargs)
        return self.model(tokens, **kwargs)


def curriculum_objective(pad: int, vocab: int, steps: int = 5, tau: float = 1e-3):
    made = build_objective("udm", pad_id=pad, curriculum_steps=steps, curriculum_tau=tau)
    made.model_vocab_size(vocab)
    return made


def test_the_curriculum_loss_is_the_exact_udm_loss_for_one_hot_inputs_at_the_same_alpha():
    pad, vocab = 3, 11
    recorder = Recorder(small_model(time_conditioning=True))
    objective = curriculum_objective(pad, vocab, tau=1e-7)
    objective._alpha_map = FixedSchedule()
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, vocab, (4, 12), generator=generator)
    tokens[tokens == pad] = 1
    noise = objective.sample_noise(4, 12, generator) | objective.step_noise(0, 4, generator)
    assert set(noise) == {"t", "uniforms", "draws", "latent_seed"}
    out = objective.loss(recorder, tokens, noise)
    seen = recorder.seen
    scored = loss_positions(tokens, pad)
    torch.testing.assert_close(seen.time.double(), noise["t"], rtol=0, atol=1e-6)
    noised = seen.tokens
    assert torch.equal(noised[~scored], tokens[~scored])
    with torch.no_grad():
        logits = recorder.model(
            noised, attention="bidirectional", output_mask=scored, time=seen.time
        )
    support = support_ids(torch.arange(vocab - 1), pad)
    t = noise["t"][scored.nonzero()[:, 0]]
    exact = position_nelbo(
        torch.log_softmax(logits[:, support], -1),
        support_index(tokens[scored], pad),
        support_index(noised[scored], pad),
        t,
    ) + prior_nats(vocab - 1)
    torch.testing.assert_close(out.nats.detach(), exact.sum(), rtol=1e-5, atol=1e-5)
    # the general form at the schedule's own alpha is the schedule's NELBO, bit for bit
    log_probs = torch.log_softmax(torch.randn(6, 10, generator=generator, dtype=torch.float64), -1)
    clean, state = torch.randint(0, 10, (2, 6), generator=generator)
    times = torch.rand(6, generator=generator, dtype=torch.float64)
    assert torch.equal(
        nelbo_at(log_probs, clean, state, alpha(times), alpha_derivative(times)),
        position_nelbo(log_probs, clean, state, times),
    )
    assert prior_nats(10) == prior_nats(10, DELTA) != prior_nats(10, 0.3)


def test_the_curriculum_weight_is_the_time_derivative_of_alpha_over_duos_gamma_range():
    """Over Duo's gamma range (span 1.75, not 1) the NELBO weight is d alpha / dt, which carries
    the chain-rule factor d gamma / dt; here it is differenced in t from the map itself."""
    pad, vocab = 3, 11
    n_support = vocab - 1
    recorder = Recorder(small_model(time_conditioning=True))
    objective = curriculum_objective(pad, vocab)
    low, high = objective.curriculum_gamma
    assert high - low == pytest.approx(1.75)
    generator = torch.Generator().manual_seed(13)
    tokens = torch.randint(0, vocab, (4, 12), generator=generator)
    tokens[tokens == pad] = 1
    noise = objective.sample_noise(4, 12, generator) | objective.step_noise(0, 4, generator)
    out = objective.loss(recorder, tokens, noise)
    seen = vars(recorder.seen).copy()
    noised = seen.pop("tokens")
    with torch.no_grad():
        logits = recorder.model(noised, **seen)
    scored = loss_positions(tokens, pad)
    support = support_ids(torch.arange(n_support), pad)

    def alpha_at_time(t):
        return argmax_alpha(low + t * (high - low), n_support)[0]

    t = noise["t"].double()[scored.nonzero()[:, 0]]
    step = 1e-6
    dalpha_dt = (alpha_at_time(t + step) - alpha_at_time(t - step)) / (2 * step)

    def total(weight):
        return nelbo_at(
            torch.log_softmax(logits[:, support].double(), -1),
            support_index(tokens[scored], pad),
            support_index(noised[scored], pad),
            alpha_at_time(t),
            weight,
        ).sum() + scored.sum() * prior_nats(n_support, float(alpha_at_time(torch.tensor(1.0))))

    torch.testing.assert_close(out.nats.double(), total(dalpha_dt), rtol=1e-4, atol=1e-4)
    # the weight without the factor (d alpha / d gamma) is far off: the check can fail
    assert not torch.allclose(out.nats.double(), total(dalpha_dt / (high - low)), rtol=1e-2)


def test_the_curriculum_loss_is_the_same_for_any_split_of_the_batch_and_gives_gradients():
    pad, vocab = 3, 11
    model = small_model()
    objective = curriculum_objective(pad, vocab)
    generator = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, vocab, (6, 10), generator=generator)
    tokens[tokens == pad] = 2
    noise = objective.sample_noise(6, 10, generator) | objective.step_noise(0, 6, generator)
    whole = objective.loss(model, tokens, noise)
    halves = [
        objective.loss(model, tokens[a:b], slice_noise(noise, a, b)) for a, b in ((0, 2), (2, 6))
    ]
    torch.testing.assert_close(sum(h.nats for h in halves), whole.nats, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(torch.cat([h.row_nats for h in halves]), whole.row_nats)
    whole.nats.backward()
    assert model.tok_embeddings.weight.grad.abs().sum() > 0
    # another latent seed is other noise
    other = dict(noise, latent_seed=noise["latent_seed"] + 1)
    assert not torch.equal(objective.loss(model, tokens, other).row_nats, whole.row_nats)


def test_the_switch_at_step_k_is_exact():
    pad, vocab, rows, length, k = 3, 11, 4, 10, 3
    plain = build_objective("udm", pad_id=pad)
    plain.model_vocab_size(vocab)
    relaxed = curriculum_objective(pad, vocab, steps=k)

    def step_noise(objective, step):
        generator = batch_generator(7, step)
        noise = objective.sample_noise(rows, length, generator)
        return (
            noise
            | annealing_noise(0, step, rows, generator, 0)
            | objective_step_noise(objective, step, rows, generator)
        )

    for step in (0, k - 1):
        during, exact = step_noise(relaxed, step), step_noise(plain, step)
        assert set(during) - set(exact) == {"latent_seed"}
        assert all(torch.equal(during[key], exact[key]) for key in exact)
    for step in (k, k + 5):
        during, exact = step_noise(relaxed, step), step_noise(plain, step)
        assert set(during) == set(exact) and all(torch.equal(during[x], exact[x]) for x in exact)
        model = small_model()
        tokens = torch.randint(
            0, vocab, (rows, length), generator=torch.Generator().manual_seed(step)
        )
        tokens[tokens == pad] = 0
        assert torch.equal(
            relaxed.loss(model, tokens, during).nats, plain.loss(model, tokens, exact).nats
        )


def train(tmp_path, name, *flags):
    from shared.training import cli

    cache = ["--cache-dir", str(tmp_path / "cache"), "--eval-every", "100"]
    out = tmp_path / name
    cli.train_from_argv(
        ["--preset", "tiny", "--objective", "udm", "--out", str(out), *cache, *flags]
    )
    return out


def weights(run):
    return load_file(str(ckpt.resolve_checkpoint(run) / "model.safetensors"))


def test_a_curriculum_run_resumes_bit_exactly_across_the_switch_and_differs_from_a_plain_one(
    tmp_path,
):
    from shared.training import cli

    flags = ["--max-steps", "4", "--curriculum-steps", "2", "--curriculum-tau", "0.01"]
    whole = train(tmp_path, "whole", *flags)
    for stop in ("1", "2"):  # before the switch, and exactly at it
        run = train(tmp_path, f"stop{stop}", *flags, "--stop-after-steps", stop)
        finished = False
        while not finished:  # each invocation trains --stop-after-steps more steps
            resume = ["--resume", str(run), "--cache-dir", str(tmp_path / "cache")]
            finished = cli.train_from_argv(resume)["finished"]
        resumed = weights(run)
        assert all(torch.equal(resumed[key], value) for key, value in weights(whole).items())
    plain = weights(train(tmp_path, "plain", "--max-steps", "4", "--curriculum-steps", "0"))
    assert any(not torch.equal(plain[key], value) for key, value in weights(whole).items())
    config = json.loads((whole / "config.json").read_text())["train_config"]
    assert config["curriculum_steps"] == 2 and config["curriculum_tau"] == 0.01


def test_the_default_curriculum_is_the_first_half_of_the_runs_steps(tmp_path):
    """udm's default (-1) trains the first half of the steps with the curriculum: the run is
    the run given that count explicitly, and not the plain one; other objectives ignore it."""
    default = weights(train(tmp_path, "default", "--max-steps", "4"))
    half = weights(train(tmp_path, "half", "--max-steps", "4", "--curriculum-steps", "2"))
    plain = weights(train(tmp_path, "plain", "--max-steps", "4", "--curriculum-steps", "0"))
    assert all(torch.equal(default[key], value) for key, value in half.items())
    assert any(not torch.equal(plain[key], value) for key, value in half.items())
    objective = build_objective("udm", pad_id=0, curriculum_steps=-1)
    objective.set_run_length(7)
    assert objective.curriculum_steps == 3


def test_a_run_saved_before_the_curriculum_existed_resumes_without_it():
    """A checkpoint whose config predates ``curriculum_steps`` trained without the curriculum:
    resuming it keeps it off, whatever today's default."""
    from shared.training import presets
    from shared.training.resume import resumed_config

    model, train = presets.resolve_config("tiny", {"objective": "udm", "max_steps": 4})
    saved = {"model_config": model.to_dict(), "train_config": dataclasses.asdict(train)}
    assert saved["train_config"].pop("curriculum_steps") == -1
    assert resumed_config(saved, {}, allow_change=False)[1].curriculum_steps == 0
    saved["train_config"]["curriculum_steps"] = -1  # saved with the field: kept
    assert resumed_config(saved, {}, allow_change=False)[1].curriculum_steps == -1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--objective", "mdm"], "curriculum_steps=2 is uniform-state diffusion's Gaussian"),
        (["--curriculum-gamma-min", "-1"], "curriculum_gamma_min=-1.0 must be below"),
        (["--curriculum-tau", "0"], "curriculum_tau=0.0 must be > 0"),
        (["--curriculum-steps", "-2"], "curriculum_steps=-2 must be >= 0"),
    ],
)
def test_bad_curriculum_settings_are_refused(tmp_path, flags, message):
    from shared.training import cli

    argv = ["--preset", "tiny", "--objective", "udm", "--curriculum-steps", "2"]
    argv += ["--out", str(tmp_path / "x"), "--max-steps", "1", "--cache-dir", str(tmp_path / "c")]
    with pytest.raises(ConfigError, match=message):
        cli.train_from_argv([*argv, *flags])
    assert not (tmp_path / "x").exists()


@pytest.mark.multiprocess
@pytest.mark.serial
def test_two_processes_reproduce_one_process_during_the_curriculum(tmp_path):
    # each row's latents come from its own seed, drawn for the global batch: a process holding
    # half of the rows must draw exactly the latents one process draws for them
    import os
    import shutil
    import subprocess
    from pathlib import Path

    from launch import free_port, two_cpu_processes

    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    common = [
        "--max-steps",
        "3",
        "--curriculum-steps",
        "2",
        "--log-every",
        "1",
        "--batch-size",
        "8",
    ]
    one = train(tmp_path, "one", *common)
    two = tmp_path / "two"
    argv = ["train.py", "--preset", "tiny", "--objective", "udm", "--out", str(two)]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--eval-every", "100", *common]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    done = subprocess.run(
        [*two_cpu_processes(port=free_port()), *argv],
        cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    def losses(run):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]

    assert len(losses(one)) == len(losses(two)) == 3
    for a, b in zip(losses(one), losses(two)):
        assert abs(a - b) / abs(a) < 1e-5
    final = json.loads((two / "final.json").read_text())
    assert final["processes"] == 2
