"""bench/peer_correctors.py: the corrector cases of bench/peer_samplers.py. Without the peers:
the command line, our ReMDM kernel, the captured step on a stand-in update. Given a clone of
kuleshov-group/remdm (DUOLM_REMDM) or of s-sahoo/duo (DUOLM_DUO): their whole samplers run on our
models, their step distributions equal ours along a trajectory, and the check sees a wrong
knob."""

import dataclasses
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import peer_adapters  # noqa: E402
import peer_correctors  # noqa: E402
import peer_samplers  # noqa: E402

from dllm.remdm import Remdm  # noqa: E402
from dllm.uniform.sampler import UniformSamplerConfig  # noqa: E402
from shared.config import ModelConfig  # noqa: E402
from shared.model import Transformer  # noqa: E402

REMDM = os.environ.get("DUOLM_REMDM")
NEEDS_REMDM = pytest.mark.skipif(
    not REMDM,
    reason="set DUOLM_REMDM to a clone of kuleshov-group/remdm (diffusion.py, scripts/) to "
    "compare its ReMDM sampler with ours",
)
DUO = os.environ.get("DUOLM_DUO")
NEEDS_DUO = pytest.mark.skipif(
    not DUO,
    reason="set DUOLM_DUO to a clone of s-sahoo/duo (trainer_base.py, algo.py) to compare its "
    "Psi sampler with ours",
)


def tiny_model(vocab_size: int, time: bool = False) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         hidden_dim=64, max_seq_len=32, time_conditioning=time)  # fmt: skip
    return Transformer(config).eval()


# ---------------------------------------------------------------- without the peers


def test_remdm_needs_its_loop_window_on_the_step_grid(capsys):
    with pytest.raises(SystemExit) as exit_:
        peer_samplers.main(["--remdm", "x", "--steps", "64"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--steps 64: ReMDM's loop (t_on 0.55, t_off 0.05)" in err and err.count("\n") == 1


def test_a_remdm_folder_without_its_files_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        peer_samplers.main(["--remdm", str(tmp_path), "--steps", "80", "--check-only"])
    assert exit_.value.code == 2
    assert f"--remdm {tmp_path}: expected {tmp_path}/diffusion.py" in capsys.readouterr().err


def test_without_a_remdm_clone_it_is_skipped_with_the_reason(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert peer_samplers.main(["--json", str(out)]) == 0
    assert "- remdm: skipped: no --remdm PATH given" in capsys.readouterr().out
    assert "remdm" in json.loads(out.read_text())["skipped"]


def test_the_cases_are_the_released_knobs_and_valid_for_ours():
    assert peer_correctors.REMDM_CASES["cap"] == {"mode": "cap", "eta": 0.008}
    for knobs in peer_correctors.REMDM_CASES.values():
        Remdm(80, **knobs).validate()
    UniformSamplerConfig(80, psi="cap", eta=peer_correctors.PSI_ETA).validate()


@pytest.mark.parametrize(
    "rule", [Remdm(10, mode="cap", eta=0.3), Remdm(20, **peer_correctors.REMDM_CASES["loop"])]
)
def test_our_kernel_is_a_distribution_that_keeps_bos(rule):
    mask = 7
    logits = torch.randn(2, 5, mask + 1, generator=torch.Generator().manual_seed(0))
    x = torch.tensor([[0, mask, 3, mask, 2], [0, 1, mask, mask, mask]])
    generated = torch.tensor([[False] + [True] * 4] * 2)
    for index in range(rule.steps):
        step = peer_correctors.our_remdm_step(
            rule.validate(), index, rule.steps, x, logits, generated
        )
        assert torch.allclose(step.sum(-1), torch.ones(2, 5, dtype=torch.float64))
        assert (step[:, 0, 0] == 1).all()  # BOS stays
        sigma = rule.step_sigma(index, rule.steps)
        assert step[0, 2, 3] == pytest.approx(1 - sigma) and step[0, 2, mask] == pytest.approx(
            sigma
        )


def test_the_captured_step_is_the_draws_distribution_where_the_update_draws():
    """A stand-in update that draws at even positions and copies x_t at odd ones."""
    module = types.SimpleNamespace(draw=lambda probs: probs.argmax(-1))
    probs = torch.tensor([[[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]]])
    x = torch.tensor([[1, 0, 1]])

    def update():
        drawn = module.draw(probs)
        return None, torch.where(torch.arange(3) % 2 == 0, drawn, x)

    step = peer_correctors.step_distribution(module, "draw", update, x, fills=(0, 1))
    assert step[0, 0].tolist() == [0.25, 0.75] and step[0, 2].tolist() == [0.0, 1.0]
    assert step[0, 1].tolist() == [1.0, 0.0]  # copied: x_t
    assert module.draw(probs).tolist() == [[1, 0, 1]]  # the real draw is back


def test_an_update_that_writes_something_else_or_draws_nothing_is_refused():
    module = types.SimpleNamespace(draw=lambda probs: probs.argmax(-1))
    x = torch.tensor([[1, 0]])
    probs = torch.ones(1, 2, 3)

    def writes_two():
        module.draw(probs)
        return None, torch.tensor([[2, 2]])

    with pytest.raises(RuntimeError, match="neither x_t nor its draw"):
        peer_correctors.step_distribution(module, "draw", writes_two, x, fills=(0, 1))
    with pytest.raises(RuntimeError, match="drew nothing through draw"):
        peer_correctors.step_distribution(module, "draw", lambda: (None, x), x, fills=(0, 1))


# ---------------------------------------------------------------- ReMDM


@NEEDS_REMDM
@pytest.mark.parametrize("case", sorted(peer_correctors.REMDM_CASES))
def test_remdm_step_is_ours_and_the_check_sees_a_wrong_eta(case):
    remdm = peer_correctors.load_remdm(REMDM)
    model = tiny_model(17)
    rule = Remdm(20, **peer_correctors.REMDM_CASES[case]).validate()
    sampler = peer_correctors.remdm_sampler(remdm, model, rule, batch=3, length=9)
    tokens = torch.tensor([[0] + [16] * 8] * 3)
    gap = peer_correctors.remdm_step_gap(remdm, sampler, model, rule, tokens, 20)
    assert gap < peer_correctors.REMDM_TOLERANCE
    other = dataclasses.replace(rule, eta=rule.eta * 2)
    assert peer_correctors.remdm_step_gap(remdm, sampler, model, other, tokens, 20) > 1e-3


@NEEDS_REMDM
def test_remdm_sampler_runs_unchanged_on_our_model():
    """Its whole loop: every position masked, its steps, the p(x0) cache, the greedy removal."""
    remdm = peer_correctors.load_remdm(REMDM)
    model = tiny_model(17)
    rule = Remdm(20, **peer_correctors.REMDM_CASES["loop"])
    tokens = peer_correctors.remdm_sampler(remdm, model, rule, batch=2, length=9)._sample(19)
    assert tokens.shape == (2, 9) and int(tokens.max()) < 16  # no [MASK] left


# ---------------------------------------------------------------- Duo's Psi sampler


@NEEDS_DUO
def test_duo_psi_step_is_ours_and_the_check_sees_a_wrong_eta():
    duo = peer_adapters.load_duo(DUO)
    network = peer_adapters.DuoNetwork(tiny_model(17, time=True), pad_id=16)
    config = UniformSamplerConfig(8, psi="cap", eta=0.01)
    sampler = peer_correctors.duo_psi_sampler(duo, network, length=10, eta=0.01)
    gap, kappa_gap = peer_correctors.psi_step_gap(duo, sampler, network, config, 2, 10)
    assert gap < peer_correctors.PSI_TOLERANCE and kappa_gap < 1e-7
    wrong = dataclasses.replace(config, eta=0.1)
    assert peer_correctors.psi_step_gap(duo, sampler, network, wrong, 2, 10)[0] > 1e-3


@NEEDS_DUO
def test_duo_psi_sampler_runs_unchanged_on_our_model():
    duo = peer_adapters.load_duo(DUO)
    network = peer_adapters.DuoNetwork(tiny_model(17, time=True), pad_id=16)
    sampler = peer_correctors.duo_psi_sampler(duo, network, length=10, eta=0.01)
    tokens = sampler.generate_samples(3, num_steps=4)
    assert tokens.shape == (3, 10) and 0 <= int(tokens.min()) and int(tokens.max()) < 16


@NEEDS_REMDM
@NEEDS_DUO
def test_one_short_run_checks_and_times_every_corrector_case(tmp_path):
    out = tmp_path / "report.json"
    argv = ["--remdm", REMDM, "--duo", DUO, "--gen-length", "8", "--block-length", "8",
            "--steps", "20", "--rounds", "1", "--warmup", "0", "--device", "cpu",
            "--json", str(out)]  # fmt: skip
    assert peer_samplers.main(argv) == 0
    report = json.loads(out.read_text())
    assert [row["peer"] for row in report["rows"]] == ["duo", "duo", "remdm", "remdm"]
    assert all(row["passed"] and row["ratio"]["median"] > 0 for row in report["rows"])
    for row in report["rows"][1:]:  # only the generated tokens are counted on both sides
        assert row["ours"]["round_tokens"] == row["theirs"]["round_tokens"] == [8]
    assert report["sources"]["remdm"]
