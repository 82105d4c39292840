"""Discrete consistency distillation of a udm run (``duolm distill``): the coupled pair sampler,
the inverse alpha map, the loss at zero time gap, a tiny end-to-end run and its refusals."""

import json
import math

import pytest
import torch

from dllm.uniform import distill
from dllm.uniform.curriculum import GammaOfAlpha, argmax_alpha, coupled_states
from dllm.uniform.objective import alpha
from shared import checkpoint as ckpt


@pytest.mark.parametrize("n_support", [3, 258, 50_257])
def test_the_inverse_map_gives_the_gamma_of_each_alpha(n_support):
    inverse = GammaOfAlpha(n_support)
    wanted = alpha(torch.tensor([1e-3, 0.05, 0.5, 0.9, 0.999], dtype=torch.float64))
    got = argmax_alpha(inverse(wanted), n_support)[0]
    torch.testing.assert_close(got, wanted, rtol=1e-4, atol=0)
    with pytest.raises(ValueError, match="invertible range"):
        inverse(torch.tensor([1.0]))


def test_the_pair_is_coupled_and_each_side_has_its_times_marginal():
    n_support, draws = 7, 30_000
    generator = torch.Generator().manual_seed(11)
    clean = torch.randint(0, n_support, (draws,), generator=generator)
    eps = torch.randn((draws, n_support), generator=generator, dtype=torch.float64)
    inverse = GammaOfAlpha(n_support)
    t, s = 0.6, 0.45
    gamma_t, gamma_s = (
        inverse(alpha(torch.full((draws,), u, dtype=torch.float64))) for u in (t, s)
    )
    # dt -> 0: the same latent, the same state
    same_t, same_s = coupled_states(clean, gamma_t, gamma_t, eps)
    assert torch.equal(same_t, same_s)
    z_t, z_s = coupled_states(clean, gamma_t, gamma_s, eps)
    for state, time in ((z_t, t), (z_s, s)):  # each an exact forward sample at its own time
        a = float(alpha(torch.tensor(time)))
        p = a + (1 - a) / n_support
        hits = int((state == clean).sum())
        assert abs(hits - draws * p) / math.sqrt(draws * p * (1 - p)) < 4.5
    # coupled: they agree far more often than two independent draws would
    a_t, a_s = (float(alpha(torch.tensor(u))) for u in (t, s))
    independent = (a_t + (1 - a_t) / n_support) * (a_s + (1 - a_s) / n_support) + (
        (1 - a_t) * (1 - a_s) * (n_support - 1) / n_support**2
    )
    agree = float((z_t == z_s).double().mean())
    assert agree > independent + 0.2, (agree, independent)
    near_t, near_s = coupled_states(clean, gamma_t, gamma_t + 1e-3, eps)
    assert float((near_t == near_s).double().mean()) > 0.995  # a tiny gap moves a few tokens


@pytest.fixture(scope="module")
def udm_and_mdm_runs(tmp_path_factory):
    from shared.training import cli

    root = tmp_path_factory.mktemp("distill")
    cache = ["--cache-dir", str(root / "cache"), "--eval-every", "100", "--max-steps", "2"]
    for objective in ("udm", "mdm"):
        cli.train_from_argv(
            ["--preset", "tiny", "--objective", objective, "--out", str(root / objective), *cache]
        )
    return root


def test_the_loss_is_zero_when_the_student_is_the_teacher_at_zero_gap(udm_and_mdm_runs):
    model, tokenizer, _ = ckpt.load_model_from_checkpoint(udm_and_mdm_runs / "udm")
    tokens = torch.randint(
        0, tokenizer.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0)
    )
    tokens[tokens == tokenizer.pad_id] = 1
    t = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    seeds = torch.tensor([1, 2, 3])
    inverse = GammaOfAlpha(model.config.vocab_size - 1)
    zero = distill.pair_loss(model, model, tokens, t, t, seeds, inverse, tokenizer.pad_id)
    assert abs(float(zero.detach())) < 1e-6
    gap = distill.pair_loss(model, model, tokens, t, t - 0.15, seeds, inverse, tokenizer.pad_id)
    assert float(gap.detach()) > 1e-6


def test_distill_writes_a_run_every_command_reads(udm_and_mdm_runs, capsys):
    from dllm import sample
    from dllm.generator import DiffusionGenerator
    from dllm.uniform.sampler import UniformSamplerConfig
    from eval import cli

    out = udm_and_mdm_runs / "student"
    argv = [
        "distill",
        str(udm_and_mdm_runs / "udm"),
        str(out),
        "--rounds",
        "2",
        "--steps-per-round",
        "2",
    ]
    argv += ["--base-steps", "8", "--lr", "1e-2", "--cache-dir", str(udm_and_mdm_runs / "cache")]
    assert cli.main(argv) == 0
    state = ckpt.read_state(ckpt.resolve_checkpoint(out))
    record = state["distilled"]
    assert record["trained_for_steps"] == [8, 4] and record["dt"] == [1 / 8, 1 / 4]
    assert state["objective"] == "udm" and state["step"] == 4
    assert json.loads((out / "config.json").read_text())["distilled"]["rounds"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    student = ckpt.load_model_from_checkpoint(out)[0].state_dict()
    teacher = ckpt.load_model_from_checkpoint(udm_and_mdm_runs / "udm")[0].state_dict()
    assert any(not torch.equal(student[k], teacher[k]) for k in teacher)
    result = DiffusionGenerator.from_checkpoint(out).generate(
        ["And"], 6, UniformSamplerConfig(steps=4), seed=0, eos="none"
    )
    assert result.raw.nfe == 4
    capsys.readouterr()
    assert sample.main([str(out), "--gen-length", "4", "--steps", "4"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert sample.main([str(out), "--gen-length", "4", "--steps", "5"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert notes == [
        "note: this student was distilled for [8, 4] steps; sampling with 5 is allowed but was "
        "not trained for"
    ]
    assert sample.main([str(udm_and_mdm_runs / "udm"), "--gen-length", "4", "--steps", "5"]) == 0
    assert "note:" not in capsys.readouterr().err  # an undistilled run has nothing to say


@pytest.mark.parametrize(
    "source, target, flags, message",
    [
        ("mdm", "new", [], "is an 'mdm' run; discrete consistency distillation applies"),
        ("udm", "udm", [], "or inside it; write the student elsewhere"),
        ("udm", "udm/inside", [], "or inside it; write the student elsewhere"),
        ("udm", "mdm", [], "already holds a training run; distill into a new folder"),
        ("udm", "new", ["--rounds", "0"], "--rounds=0 must be >= 1"),
        ("udm", "new", ["--base-steps", "6", "--rounds", "3"], "must be a multiple of 2"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    udm_and_mdm_runs, capsys, source, target, flags, message
):
    before = sorted(p.name for p in udm_and_mdm_runs.iterdir())
    inside = sorted(p.name for p in (udm_and_mdm_runs / "udm").iterdir())
    argv = [
        str(udm_and_mdm_runs / source),
        str(udm_and_mdm_runs / target),
        "--cache-dir",
        str(udm_and_mdm_runs / "cache"),
        *flags,
    ]
    assert distill.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in udm_and_mdm_runs.iterdir()) == before
    assert sorted(p.name for p in (udm_and_mdm_runs / "udm").iterdir()) == inside
