"""The Psi-samplers' kappa schedules against Duo's (s-sahoo/duo, ``trainer_base.py``'s
``_mode_to_psi_kappas``): given a clone in DUOLM_DUO, its max-capped and constant-remdm kappas
on the same time grid are ours for "cap" and for the loop's held steps. Its max-rescale mode
computes eta * min(eta, (1 - alpha_s) / alpha_t), not the paper's eta * min(1, ...): ours follows
the paper, and the test pins where the two part."""

import os
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import peer_adapters  # noqa: E402

from dllm.uniform.objective import DELTA  # noqa: E402
from dllm.uniform.sampler import UniformSamplerConfig, psi_plan  # noqa: E402

DUO = os.environ.get("DUOLM_DUO")
pytestmark = pytest.mark.skipif(
    not DUO,
    reason="set DUOLM_DUO to a clone of s-sahoo/duo (trainer_base.py, algo.py) to compare its "
    "Psi kappa schedules with ours",
)


def their_kappas(mode: str, times: list[float]) -> list[float]:
    base = peer_adapters.load_duo(DUO).trainer_base
    this = types.SimpleNamespace(noise=base.LogLinear(DELTA))
    grid = torch.tensor(times, dtype=torch.float64)
    return base.Diffusion._mode_to_psi_kappas(this, mode, grid).tolist()


@pytest.mark.parametrize("eta", [0.01, 0.2, 0.9])
def test_capped_kappas_are_theirs(eta):
    steps = 8
    plan = psi_plan(UniformSamplerConfig(steps, psi="cap", eta=eta))
    times = [t for t, _, _ in plan] + [0.0]
    theirs = their_kappas(f"max-capped-{eta}", times)
    for (_, _, ours), their in zip(plan[:-1], theirs[: steps - 1]):  # the last step: s = 0
        assert ours == pytest.approx(their, abs=1e-6)


def test_the_held_steps_of_the_loop_are_their_constant_remdm():
    config = UniformSamplerConfig(10, psi="loop", eta=0.02, t_on=0.6, t_off=0.2, alpha_on=0.9)
    held = [(t, kappa) for t, s, kappa in psi_plan(config) if t == s]
    assert len(held) == 4
    t = held[0][0]
    theirs = their_kappas("constant-remdm-0.02", [t, t])[0]
    assert all(kappa == pytest.approx(theirs, abs=1e-6) for _, kappa in held)


def test_their_rescale_parts_from_the_papers():
    plan = psi_plan(UniformSamplerConfig(4, psi="rescale", eta=0.5))
    times = [t for t, _, _ in plan] + [0.0]
    theirs = their_kappas("max-rescale-0.5", times)
    # step 1: alpha_t = 0.25, alpha_s = 0.5: (1 - alpha_s) / alpha_t = 2 (about), so the paper's
    # sigma = 0.5 * 1 and theirs 0.5 * 0.5
    assert plan[1][2] == pytest.approx(0.0, abs=1e-3)
    assert theirs[1] == pytest.approx(0.5, abs=1e-3)
