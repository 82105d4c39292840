"""ReMDM against its public code (kuleshov-group/remdm, ``diffusion.py``'s
``Diffusion._ddpm_caching_update``): given a clone in DUOLM_REMDM, one step of its cap, rescale,
conf and loop samplers on one position draws the same distribution as one step of ours at the
same times (frequencies over many rows, chi-square against our kernel). Its module is loaded
with its training imports (hydra, lightning, torchmetrics, transformers and its own data and
model modules) stood in for by empty modules: the update itself needs only torch."""

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from scipy import stats

from dllm.remdm import Remdm, reveal_probability

REMDM = os.environ.get("DUOLM_REMDM")
pytestmark = pytest.mark.skipif(
    not REMDM,
    reason="set DUOLM_REMDM to a clone of kuleshov-group/remdm (diffusion.py) to compare its "
    "remasking step with ours",
)
STAND_INS = ("hydra", "hydra.utils", "lightning", "torchmetrics", "torchmetrics.aggregation")
STAND_INS += ("transformers", "dataloader", "models", "noise_schedule", "utils")
V, MASK = 3, 3  # three tokens and the mask id


def load_remdm(monkeypatch) -> types.ModuleType:
    for name in STAND_INS:
        stand_in = types.ModuleType(name)
        stand_in.__getattr__ = lambda attribute: object  # any class the module body names
        monkeypatch.setitem(sys.modules, name, stand_in)
    sys.modules["lightning"].LightningModule = torch.nn.Module
    sys.modules["torchmetrics"].aggregation = sys.modules["torchmetrics.aggregation"]
    sys.modules["hydra"].utils = sys.modules["hydra.utils"]
    spec = importlib.util.spec_from_file_location("remdm_diffusion", Path(REMDM) / "diffusion.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def their_step(module, rule: Remdm, index: int, start: int, p_x0: torch.Tensor, n: int):
    """Their update from state ``start`` at t = 1 - index/steps on ``n`` one-position rows."""
    sampling = types.SimpleNamespace(
        sampler=f"remdm-{rule.mode}",
        eta=rule.eta,
        nucleus_p=1.0,
        t_on=rule.t_on,
        t_off=rule.t_off,
        alpha_on=rule.alpha_on,
    )
    self = types.SimpleNamespace(
        config=types.SimpleNamespace(
            noise=types.SimpleNamespace(type="loglinear"), sampling=sampling
        ),
        noise=lambda t: (t, None),
        mask_index=MASK,
        time_conditioning=False,
    )
    x = torch.full((n, 1), start)
    t = torch.full((n, 1), 1.0 - index / rule.steps, dtype=torch.float64)
    if start != MASK:  # MDLM's SUBS: a revealed position's prediction is its own token
        p_x0 = torch.nn.functional.one_hot(torch.tensor(start), V + 1).double()
    probs = p_x0.expand(n, 1, V + 1).clone()
    revealed_conf = -0.4 if start != MASK else -float("inf")  # one position: any value
    conf = torch.full((n, 1), revealed_conf, dtype=torch.float64)
    _, xs, _ = module.Diffusion._ddpm_caching_update(
        self, x, t, 1.0 / rule.steps, p_x0=probs, conf=conf
    )
    return torch.bincount(xs.flatten(), minlength=V + 1)


def our_kernel(rule: Remdm, index: int, start: int, x_theta: torch.Tensor) -> torch.Tensor:
    _, _, a_t, a_s = rule.alphas(index, rule.steps)
    sigma = rule.step_sigma(index, rule.steps)
    out = torch.zeros(V + 1, dtype=torch.float64)
    if start != MASK:
        out[start], out[MASK] = 1 - sigma, sigma
        return out
    p = reveal_probability(a_t, a_s, 0.0 if rule.mode == "conf" else sigma)
    out[:V], out[MASK] = p * x_theta, 1 - p
    return out


@pytest.mark.parametrize("rule, index", [
    (Remdm(10, mode="cap", eta=0.3, schedule="linear"), 4),
    (Remdm(10, mode="rescale", eta=0.6, schedule="linear"), 6),
    (Remdm(10, mode="conf", schedule="linear"), 5),
    # t_off = 0.1, not the released 0.05: their code sorts a step by t as computed, and
    # 1 - 19/20 = 0.050000000000000044 > 0.05 would make the last step a held one there
    (Remdm(20, mode="loop", eta=0.05, t_on=0.55, t_off=0.1, alpha_on=0.9), 5),  # rising
    (Remdm(20, mode="loop", eta=0.05, t_on=0.55, t_off=0.1, alpha_on=0.9), 12),  # held
    (Remdm(20, mode="loop", eta=0.05, t_on=0.55, t_off=0.1, alpha_on=0.9), 18),  # falling
    (Remdm(20, mode="loop", eta=0.05, t_on=0.55, t_off=0.1, alpha_on=0.9), 19),  # last
])  # fmt: skip
def test_one_step_draws_their_distribution(rule, index, monkeypatch):
    module = load_remdm(monkeypatch)
    x_theta = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p_x0 = torch.cat([x_theta, torch.zeros(1, dtype=torch.float64)])
    torch.manual_seed(0)
    n = 20000
    for start in (0, 2, MASK):
        counts = their_step(module, rule.validate(), index, start, p_x0, n)
        expected = our_kernel(rule, index, start, x_theta) * n
        assert (counts[expected == 0] == 0).all(), (start, counts, expected)
        keep = expected > 0
        if keep.sum() > 1:
            p = stats.chisquare(counts[keep].double().numpy(), expected[keep].numpy()).pvalue
            assert p > 1e-4, (rule.mode, index, start, counts, expected)
