"""The corrector cases of ``bench/peer_samplers.py``: our ReMDM sampler (``dllm.remdm``) against
ReMDM's public code (kuleshov-group/remdm), and our Psi-sampler of the uniform family
(``dllm.uniform.sampler``, ``psi="cap"``) against Duo's (s-sahoo/duo, ``predictor=psi``). As for
the other peers, nothing of theirs is copied here: their modules are imported from the folder
the user gives and their methods run unchanged, bound to a stand-in object whose forward is our
model.

- ReMDM: ``Diffusion._sample`` (the ``ddpm_cache`` predictor: ``_ddpm_caching_update`` with its
  p(x0) cache, the grid 1 to 1e-5, then its greedy noise removal) with ``sampling.sampler`` =
  ``remdm-cap`` or ``remdm-loop``, its forward being our masked model through ReMDM's own
  ``_subs_parameterization``. Its training imports (hydra, lightning, torchmetrics,
  transformers and its data and backbone modules) get stand-ins while its file loads; its
  ``noise_schedule`` is loaded for real.
- Duo's Psi sampler: ``generate_samples`` with ``predictor=psi`` and the max-capped-eta kappas
  in all three of its phases (``high_frac = middle_frac = 0``, as its
  ``scripts/psi_samplers/owt/duo_max_capped_remdm.sh`` runs it), its ancestral noise removal.

Tokens cannot be compared (both peers draw from the global RNG by Gumbel-max, we draw per row by
inverse CDF), so each check compares the step's distribution: along one trajectory, their update
and ours from the same p(x0), the same x_t and the same times, at every step. Their update samples
through a module-level Gumbel-max function; the check swaps that function for one that keeps the
distribution it is handed (``captured_step``), which leaves their update itself unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peer_adapters
import torch
from peer_adapters import BOS
from peer_cases import SHAPES, Pair, build_model, counted

from dllm.generator import DiffusionGenerator
from dllm.remdm import Remdm, reveal_probability
from dllm.sampler import SamplerConfig
from dllm.uniform.objective import alpha
from dllm.uniform.sampler import UniformSamplerConfig, corrected_step, psi_plan
from shared.model import Transformer
from shared.sampling import sample_categorical

# ReMDM's released settings (scripts/remdm-cap.sh, scripts/remdm-loop.sh; their nucleus 0.9 is
# left out: nucleus_p 1.0 is its config's default) and Duo's max-capped eta
# (scripts/psi_samplers/owt/duo_max_capped_remdm.sh).
REMDM_CASES = {
    "cap": dict(mode="cap", eta=0.008),
    "loop": dict(mode="loop", eta=0.02, t_on=0.55, t_off=0.05, alpha_on=0.9),
}
PSI_ETA = 0.01
# ReMDM: both sides compute the step from the same float64 p(x0) and times; what is left is the
# rounding of one formula written two ways.
REMDM_TOLERANCE = 1e-12
# Duo: its eta is a float32 tensor (0.01 becomes 0.009999999776), which moves kappa by up to
# about 1e-8 on a 64-step grid; the step's distribution moves by at most twice that.
PSI_TOLERANCE = 1e-6


# ---------------------------------------------------------------- loading ReMDM


def remdm_missing(path: str) -> str | None:
    folder = Path(path)
    if (folder / "diffusion.py").is_file() and (folder / "scripts" / "remdm-loop.sh").is_file():
        return None
    return (
        f"--remdm {path}: expected {folder}/diffusion.py and {folder}/scripts/remdm-loop.sh "
        "(a clone of kuleshov-group/remdm)"
    )


def any_name_stand_in(name: str) -> types.ModuleType:
    """A stand-in module whose every attribute is ``object`` (a base class or an annotation the
    module body names, never called by the sampler)."""
    module = peer_adapters.stand_in(name)

    def attribute(key: str) -> type:
        if key.startswith("__"):  # __file__, __path__, ...: what the import machinery asks
            raise AttributeError(key)
        return object

    module.__getattr__ = attribute
    return module


def load_remdm(path: str) -> types.SimpleNamespace:
    """ReMDM's ``diffusion`` and ``noise_schedule`` modules."""
    folder = Path(path)
    stand_ins = peer_adapters.lightning_repo_stand_ins()
    metrics = any_name_stand_in("torchmetrics")
    metrics.aggregation = any_name_stand_in("torchmetrics.aggregation")
    stand_ins |= {
        "torchmetrics": metrics,
        "torchmetrics.aggregation": metrics.aggregation,
        "transformers": any_name_stand_in("transformers"),
    }
    with peer_adapters.peer_imports(folder, stand_ins):
        diffusion = importlib.import_module("diffusion")
        noise_schedule = importlib.import_module("noise_schedule")
    # Its sampler draws a progress bar over the steps at every call: the same tqdm, silenced.
    diffusion.tqdm = functools.partial(diffusion.tqdm, disable=True)
    return types.SimpleNamespace(diffusion=diffusion, noise_schedule=noise_schedule)


REMDM_METHODS = ("_sample", "_ddpm_caching_update", "_sample_prior", "_subs_parameterization")


def remdm_sampler(remdm, model: Transformer, rule: Remdm, batch: int, length: int) -> Any:
    """An object on which ReMDM's ``_sample(num_steps)`` runs as in ReMDM with ``rule``'s mode
    and knobs: ``batch`` rows of ``length`` positions, all generated (it has no prompt), the
    ``ddpm_cache`` predictor, no nucleus, greedy noise removal at the end; its forward is our
    masked model (not time-conditioned, as ReMDM's released MDLM) through ReMDM's own
    ``_subs_parameterization``."""
    methods = {name: getattr(remdm.diffusion.Diffusion, name) for name in REMDM_METHODS}
    sampler = type("RemdmModuleStandIn", (), methods)()

    def forward(x, sigma):
        logits = model(x, attention="bidirectional").float()
        return sampler._subs_parameterization(logits=logits, xt=x)

    sampling = types.SimpleNamespace(
        steps=None, noise_removal=True, nucleus_p=1.0, dfm=False,
        sampler=f"remdm-{rule.mode}", eta=rule.eta, t_on=rule.t_on, t_off=rule.t_off,
        alpha_on=rule.alpha_on,
    )  # fmt: skip
    config = types.SimpleNamespace(
        sampling=sampling,
        loader=types.SimpleNamespace(eval_batch_size=batch),
        model=types.SimpleNamespace(length=length),
        noise=types.SimpleNamespace(type="loglinear"),
    )
    sampler.__dict__.update(
        config=config,
        sampler="ddpm_cache",
        parameterization="subs",
        mask_index=model.config.vocab_size - 1,
        neg_infinity=-1000000.0,
        noise=remdm.noise_schedule.LogLinearNoise(),
        time_conditioning=False,
        device=next(model.parameters()).device,
        forward=forward,
    )
    return sampler


# ---------------------------------------------------------------- capturing a step


@contextlib.contextmanager
def captured_step(module: types.ModuleType, name: str, fill: int) -> Iterator[dict]:
    """Within the block, ``module.<name>`` (a peer's Gumbel-max draw) keeps the distribution it
    is handed in the yielded dict (``"probs"``, normalised, float64) and returns ``fill`` at
    every position instead of a draw."""
    seen: dict = {}
    original = getattr(module, name)

    def keep(probs: torch.Tensor) -> torch.Tensor:
        probs = probs.to(torch.float64)
        seen["probs"] = probs / probs.sum(-1, keepdim=True)
        return torch.full(probs.shape[:-1], fill, dtype=torch.long, device=probs.device)

    setattr(module, name, keep)
    try:
        yield seen
    finally:
        setattr(module, name, original)


def step_distribution(module, name: str, update, x: torch.Tensor, fills: tuple[int, int]):
    """[B, L, V] the distribution of x_s under ``update()`` (a peer's update: x_s is the second
    item of what it returns, in ReMDM and in Duo): run twice with
    the draw replaced by each of ``fills``; where x_s is the draw both times, the distribution
    the draw was handed, elsewhere (a position the update copies) x_t itself."""
    outcomes, probs = [], None
    for fill in fills:
        with captured_step(module, name, fill) as seen:
            outcomes.append(update()[1])
        if "probs" not in seen:
            raise RuntimeError(f"their update drew nothing through {name}: not the step expected")
        probs = seen["probs"]
    drawn = (outcomes[0] == fills[0]) & (outcomes[1] == fills[1])
    if not ((outcomes[0] == x) | drawn).all() or not ((outcomes[1] == x) | drawn).all():
        raise RuntimeError("their update wrote a position that is neither x_t nor its draw")
    kept = torch.nn.functional.one_hot(x, probs.shape[-1]).to(torch.float64)
    return torch.where(drawn[..., None], probs, kept)


# ---------------------------------------------------------------- ReMDM's step against ours


def our_remdm_step(rule: Remdm, index: int, steps: int, x, logits, generated) -> torch.Tensor:
    """[B, L, V + 1] the distribution our ReMDM step draws x_s from (``Remdm.step``'s kernel:
    a masked position is revealed with ``reveal_probability`` and its token drawn from x_theta,
    a token the sampler revealed is remasked with the step's sigma, other tokens stay)."""
    mask_id = logits.shape[-1] - 1
    _, _, a_t, a_s = rule.alphas(index, steps)
    sigma = rule.step_sigma(index, steps)
    reveal = reveal_probability(a_t, a_s, sigma)
    x_theta = torch.softmax(logits[..., :mask_id].to(torch.float64), dim=-1)
    masked = (x == mask_id)[..., None]
    kept = torch.nn.functional.one_hot(x, mask_id + 1).to(torch.float64)
    remasked = torch.zeros_like(kept)
    remasked[..., mask_id] = 1.0
    revealed_step = (1.0 - sigma) * kept + sigma * remasked
    on_mask = torch.cat([reveal * x_theta, torch.full_like(x_theta[..., :1], 1.0 - reveal)], -1)
    step = torch.where(masked, on_mask, revealed_step)
    return torch.where(generated[..., None], step, kept)


@torch.no_grad()
def remdm_step_gap(remdm, sampler, model: Transformer, rule: Remdm, tokens, steps: int) -> float:
    """Largest |ReMDM's step distribution - ours| over the generated positions of one
    trajectory of ``steps`` steps from ``tokens`` (BOS + masks): both from our model's p(x0) in
    float64 (theirs through its ``_subs_parameterization``), x_t and the step's times (t as our
    loop rounds it, dt = 1 / steps); x_s is drawn from ours to go on. BOS is left out: ReMDM
    generates every position and may remask it, ours never touches it."""
    mask_id = model.config.vocab_size - 1
    generated = tokens == mask_id
    x = tokens.clone()
    draws = torch.Generator().manual_seed(0)
    conf = torch.full(x.shape, -torch.inf, dtype=torch.float64, device=x.device)
    gap = 0.0
    for index in range(steps):
        logits = model(x, attention="bidirectional").to(torch.float64)
        p_x0 = sampler._subs_parameterization(logits=logits.clone(), xt=x).exp()
        t = torch.full((len(x), 1), round(1.0 - index / steps, 12), dtype=torch.float64)
        update = functools.partial(
            sampler._ddpm_caching_update, x, t.to(x.device), 1.0 / steps, p_x0, conf
        )
        fills = (mask_id, 0)
        theirs = step_distribution(remdm.diffusion, "_sample_categorical", update, x, fills)
        ours = our_remdm_step(rule, index, steps, x, logits, generated)
        gap = max(gap, float((theirs - ours)[generated].abs().max()))
        x = sample_categorical(ours.flatten(0, 1).cpu(), draws).view(x.shape).to(x.device)
    return gap


# ---------------------------------------------------------------- Duo's Psi step against ours


PSI_METHODS = {
    "_psi_update": "Diffusion",
    "_get_kappas": "Diffusion",
    "_mode_to_psi_kappas": "Diffusion",
    "_forward_process": "UniformState",
}


def duo_psi_sampler(duo, network, length: int, eta: float) -> Any:
    """Duo's stand-in (``peer_adapters.duo_sampler``) set up for its Psi sampler: kappas of
    mode max-capped-``eta`` at every step of the linear time grid, ancestral noise removal."""
    sampler = peer_adapters.duo_sampler(duo, network, length)
    base = duo.trainer_base
    for name, owner in PSI_METHODS.items():
        setattr(type(sampler), name, getattr(getattr(base, owner), name))
    mode = f"max-capped-{eta}"
    sampling = sampler.config.sampling
    sampling.predictor, sampling.noise_removal = "psi", "ancestral"
    sampling.psi = types.SimpleNamespace(
        time_profile="linear", high_mode=mode, middle_mode=mode, low_mode=mode,
        high_frac=0.0, middle_frac=0.0,
    )  # fmt: skip
    sampler.sampler = "psi"
    return sampler


@torch.no_grad()
def psi_step_gap(duo, sampler, network, config: UniformSamplerConfig, batch: int, length: int):
    """(largest |Duo's Psi step distribution - ours|, largest |their kappa - ours|) over one
    trajectory of ``config.steps`` steps from Duo's prior: both from the same x_theta (our
    model's, renormalised in float64 as in ``peer_checks.posterior_gap``), z_t and times; their
    kappas from their ``_mode_to_psi_kappas`` on our time grid. The last step (to s = 0) is their
    ancestral noise removal against our kappa = 1 step. z_s is drawn from ours to go on."""
    plan = psi_plan(config)
    grid = torch.tensor([t for t, _, _ in plan] + [0.0], dtype=torch.float64)
    kappas = sampler._mode_to_psi_kappas(sampler.config.sampling.psi.low_mode, grid)
    torch.manual_seed(0)
    z = sampler.prior_sample(batch, length)
    draws = torch.Generator().manual_seed(0)
    gap = kappa_gap = 0.0
    for i, (t, s, kappa) in enumerate(plan):
        time = torch.full((batch, 1), t, dtype=torch.float64, device=z.device)
        sigma = sampler._sigma_from_alphat(alpha(time).float())
        x_theta = network(z, sigma).to(torch.float64).exp()
        x_theta = x_theta / x_theta.sum(-1, keepdim=True)
        if s > 0.0:
            kappa_gap = max(kappa_gap, abs(float(kappas[i]) - kappa))
            update = functools.partial(sampler._psi_update, x=z, t=time, labels=None, dt=t - s,
                                       kappa=kappas[i], p_x0=x_theta)  # fmt: skip
        else:
            update = functools.partial(sampler._ancestral_update, x=z, t=time, labels=None,
                                       dt=None, p_x0=x_theta, noise_removal_step=True)  # fmt: skip
        fills = (0, 1)
        theirs = step_distribution(duo.trainer_base, "sample_categorical", update,
                                   z, fills)  # fmt: skip
        ours = corrected_step(x_theta.flatten(0, 1), z.flatten(), t, s, kappa)
        gap = max(gap, float((theirs.flatten(0, 1) - ours).abs().max()))
        z = sample_categorical(ours.cpu(), draws).view(batch, length).to(z.device)
    return gap, kappa_gap


# ---------------------------------------------------------------- the pairs


def remdm_pairs(args: argparse.Namespace, remdm) -> list[Pair]:
    """Our ReMDM sampler and ReMDM's, in cap and in loop mode at ReMDM's released knobs, on a
    random masked model, temperature 1, no nucleus. The same NFE: ReMDM's ``--steps - 1`` steps
    (grid 1 to 1e-5) plus its greedy noise removal, our ``--steps`` steps (grid 1 to 0). ReMDM
    generates every one of BOS + ``--gen-length`` positions (it has no prompt); only
    ``--gen-length`` tokens a row are counted on both sides."""
    model = build_model(args.shape, args.device, extra_rows=1)
    ours = DiffusionGenerator(model, eos_id=BOS)
    canvas = ours.prompt_canvas([[]] * args.batch, args.gen_length)
    pairs = []
    for case, knobs in REMDM_CASES.items():
        rule = Remdm(args.steps, **knobs).validate()
        sampler = remdm_sampler(remdm, model, rule, args.batch, canvas.length)
        config = SamplerConfig(rule)

        def run_ours(config=config) -> torch.Tensor:
            return ours.fill(canvas, config, seed=0, eos="none").raw.generated

        def run_theirs(sampler=sampler) -> torch.Tensor:
            return sampler._sample(num_steps=args.steps - 1)[:, 1:]

        def check(sampler=sampler, rule=rule) -> dict[str, Any]:
            tokens = canvas.tokens.to(args.device)
            gap = remdm_step_gap(remdm, sampler, model, rule, tokens, args.steps)
            return gap_result(gap, REMDM_TOLERANCE, "step distributions", {"step_gap": gap})

        knob_text = ", ".join(f"{k} {v}" for k, v in knobs.items() if k != "mode")
        name = f"{case} {args.steps} NFE, {knob_text}"
        pairs.append(Pair("remdm", name, counted(run_ours), counted(run_theirs), check))
    return pairs


def duo_psi_pair(args: argparse.Namespace, duo) -> Pair:
    """Our Psi sampler (``psi="cap"``, eta ``PSI_ETA``) and Duo's (max-capped-eta), the same NFE:
    Duo's ``--steps - 1`` Psi steps (grid 1 to 1e-5) plus its ancestral noise removal, our
    ``--steps`` steps (grid 1 to 0, the last one ancestral). Duo generates BOS's slot too; only
    ``--gen-length`` tokens a row are counted on both sides."""
    pad = SHAPES[args.shape]["vocab_size"] - 1  # the support is every id but padding
    model = build_model(args.shape, args.device, extra_rows=0, time=True)
    ours = DiffusionGenerator(model, state={"objective": "udm"}, eos_id=BOS, pad_id=pad)
    canvas = ours.prompt_canvas([[]] * args.batch, args.gen_length)
    config = UniformSamplerConfig(steps=args.steps, psi="cap", eta=PSI_ETA).validate()
    network = peer_adapters.DuoNetwork(model, pad)
    sampler = duo_psi_sampler(duo, network, canvas.length, PSI_ETA)

    def run_ours() -> torch.Tensor:
        return ours.fill(canvas, config, seed=0, eos="none").raw.generated

    def run_theirs() -> torch.Tensor:
        return sampler.generate_samples(args.batch, num_steps=args.steps - 1)[:, 1:]

    def check() -> dict[str, Any]:
        gap, kappa_gap = psi_step_gap(duo, sampler, network, config, args.batch, canvas.length)
        extra = {"step_gap": gap, "kappa_gap": kappa_gap}
        return gap_result(gap, PSI_TOLERANCE, f"Psi step distributions (kappa gap "
                          f"{kappa_gap:.1e})", extra)  # fmt: skip

    name = f"Psi cap eta {PSI_ETA}, {args.steps} NFE"
    return Pair("duo", name, counted(run_ours), counted(run_theirs), check)


def gap_result(gap: float, tolerance: float, what: str, extra: dict) -> dict[str, Any]:
    """A check's outcome from the largest difference of the step distributions."""
    passed = gap < tolerance
    line = (
        f"{what} {'equal' if passed else 'DIFFER'} (largest difference {gap:.1e}, tolerance "
        f"{tolerance:.0e}); tokens not comparable (different random streams)"
    )
    return {"passed": passed, "what": line, **extra}
