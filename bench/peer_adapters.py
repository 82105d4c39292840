"""Thin adapters that run public diffusion samplers, unchanged, on our models' outputs
(``bench/peer_samplers.py``). Nothing of the peers is copied here: their files are imported from
the folder the user gives.

- Fast-dLLM (NVlabs/Fast-dLLM, ``llada/``): its ``LLaDAModelLM`` gets our weights under LLaDA's
  names; ``MaskColumnDropped`` sets the [MASK] logit to -inf in what ``model(x).logits`` returns
  (our models never predict [MASK]); its ``generate`` functions then run as published.
- Duo (s-sahoo/duo): its sampler is a set of methods of its Lightning module. ``duo_sampler``
  binds those methods, unchanged, to a stand-in object holding the attributes they read (the
  sampling config, the noise schedule, the vocabulary size) and whose ``forward`` is our
  network (``DuoNetwork``). Its modules import data, metric and backbone code (and hydra,
  lightning, flash-attn, timm, torchvision through them) that the sampler never calls; those
  imports are given empty stand-in modules while Duo's files load.
- bd3lms (kuleshov-group/bd3lms): the same for its block sampler (``bd3lms_sampler``): its
  ``Diffusion`` methods bound to a stand-in whose forward is our block-diffusion model under the
  block-causal mask, passed through bd3lms's own ``_subs_parameterization``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dllm.block.objective import block_causal_mask
from dllm.uniform.objective import DELTA, support_ids
from shared.checkpoint import full_model_state
from shared.formats.diffusion import llada_config_fields, llada_weight_name
from shared.model import Transformer

BOS = 0  # the id the bench's canvases start with


@contextlib.contextmanager
def peer_imports(folder: Path, stand_ins: dict[str, types.ModuleType]) -> Iterator[None]:
    """Import a peer's top-level modules from ``folder``, with ``stand_ins`` in place of the
    modules it imports but the sampler never uses. Afterwards every module loaded from the
    folder or stood in is taken out of ``sys.modules`` again (the objects stay usable): peers
    use generic top-level names (``model``, ``utils``, ``models``) that must not collide."""
    before = set(sys.modules)
    saved = {name: sys.modules[name] for name in stand_ins if name in sys.modules}
    sys.modules.update(stand_ins)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        root = str(folder.resolve())
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if str(Path(origin).resolve()).startswith(root) or name in stand_ins:
                del sys.modules[name]
        for name in stand_ins:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def source_of(path: str) -> str:
    """What the peer folder says it is (a SOURCE file with repository and commit), or its path."""
    source = Path(path) / "SOURCE"
    return source.read_text().strip() if source.is_file() else str(Path(path).resolve())


def load_file(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


# ---------------------------------------------------------------- Fast-dLLM


def fast_dllm_missing(path: str) -> str | None:
    """Why ``path`` is not a Fast-dLLM folder (None when it is)."""
    folder = Path(path) / "llada"
    if (folder / "generate.py").is_file() and (folder / "model" / "modeling_llada.py").is_file():
        return None
    return (
        f"--fast-dllm {path}: expected {folder}/generate.py and {folder}/model/modeling_llada.py "
        "(a folder holding Fast-dLLM's llada/ directory)"
    )


def load_fast_dllm(path: str) -> types.SimpleNamespace:
    """Fast-dLLM's generate module and its LLaDA classes (``generate``, ``LLaDAConfig``,
    ``LLaDAModelLM``)."""
    folder = Path(path) / "llada"
    with peer_imports(folder, {}):
        generate = load_file(folder / "generate.py", "fast_dllm_generate")
        modeling = sys.modules["model.modeling_llada"]
        config = sys.modules["model.configuration_llada"]
    return types.SimpleNamespace(
        generate=generate, LLaDAConfig=config.LLaDAConfig, LLaDAModelLM=modeling.LLaDAModelLM
    )


def llada_peer(fast_dllm: types.SimpleNamespace, model: Transformer, eos_id: int) -> Any:
    """Fast-dLLM's ``LLaDAModelLM`` with ``model``'s config and weights (the names and config
    ``duolm export`` writes)."""
    mask_id = model.config.vocab_size - 1
    fields = llada_config_fields(model.config, mask_id, eos_id, eos_id)
    peer = fast_dllm.LLaDAModelLM(fast_dllm.LLaDAConfig(**fields), init_params=False)
    # Their forward reads config.use_cache, which transformers 5 no longer keeps on a config
    # (LLaDA's config.json says false, as does LLaDAConfig's default).
    peer.config.use_cache = False
    weights = {llada_weight_name(n): t for n, t in full_model_state(model).items()}
    if model.config.tie_embeddings:  # LLaDA's tied head is its embedding, stored once
        head = weights.pop("model.transformer.ff_out.weight")
        weights.setdefault("model.transformer.wte.weight", head)
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"LLaDA weights: missing {missing}, unexpected {unexpected}")
    return peer.to(next(model.parameters()).device).eval()


class MaskColumnDropped:
    """Fast-dLLM's model with the [MASK] logit at -inf: SUBS, as our models are used. Everything
    else (the call, ``past_key_values``, ``replace_position``) passes through unchanged."""

    def __init__(self, model: torch.nn.Module, mask_id: int):
        self.model = model
        self.mask_id = mask_id

    @property
    def device(self) -> torch.device:
        return self.model.device

    def __call__(self, *args, **kwargs):
        output = self.model(*args, **kwargs)
        output.logits[..., self.mask_id] = float("-inf")
        return output


# ---------------------------------------------------------------- Duo


# The imports of Duo's and bd3lms's diffusion modules that their sampling methods never use
# (the two share one layout): data loading, metrics, backbones, training utilities, Hydra and
# Lightning (the classes derive from LightningModule; the stand-in's base is torch's Module so
# that the class statements run). bd3lms's ``noise_schedule`` is its own and is loaded for real.
def lightning_repo_stand_ins() -> dict[str, types.ModuleType]:
    lightning = stand_in("lightning", LightningModule=torch.nn.Module)
    hydra = stand_in("hydra", utils=stand_in("hydra.utils"))
    models = stand_in("models", dit=stand_in("models.dit"), ema=stand_in("models.ema"))
    return {
        "lightning": lightning,
        "hydra": hydra,
        "hydra.utils": hydra.utils,
        "dataloader": stand_in("dataloader"),
        "metrics": stand_in("metrics"),
        "models": models,
        "models.dit": models.dit,
        "models.ema": models.ema,
        "utils": stand_in("utils"),
    }


def duo_missing(path: str) -> str | None:
    folder = Path(path)
    if (folder / "trainer_base.py").is_file() and (folder / "algo.py").is_file():
        return None
    return f"--duo {path}: expected {folder}/trainer_base.py and {folder}/algo.py (a Duo clone)"


def load_duo(path: str) -> types.SimpleNamespace:
    """Duo's ``trainer_base`` and ``algo`` modules."""
    folder = Path(path)
    with peer_imports(folder, lightning_repo_stand_ins()):
        trainer_base = importlib.import_module("trainer_base")
        algo = importlib.import_module("algo")
    return types.SimpleNamespace(trainer_base=trainer_base, algo=algo)


class DuoNetwork:
    """Duo's ``forward(xt, sigma)`` on our udm model: ``xt`` indexes the support (every id but
    padding), sigma = -log alpha_t is turned back into t (the same log-linear schedule,
    alpha_t = 1 - (1 - DELTA) t, Duo's LogLinear with eps = DELTA), and the result is
    log x_theta over the support, as Duo's ``_process_model_output`` returns it."""

    def __init__(self, model: Transformer, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        n_support = model.config.vocab_size - 1
        device = next(model.parameters()).device
        self.support = support_ids(torch.arange(n_support, device=device), pad_id)

    def __call__(self, xt: torch.Tensor, sigma: torch.Tensor, labels=None) -> torch.Tensor:
        t = (1.0 - torch.exp(-sigma.reshape(-1))) / (1.0 - DELTA)
        ids = support_ids(xt, self.pad_id)
        logits = self.model(ids, attention="bidirectional", time=t.float())
        return logits[..., self.support].log_softmax(-1)


# The methods of Duo's sampler, by the class that defines them.
DUO_METHODS = {
    "generate_samples": "Diffusion",
    "_get_sampling_time_profile": "Diffusion",
    "_ancestral_update": "Diffusion",
    "_get_ancestral_posterior": "Diffusion",
    "_get_posterior_from_xt": "Diffusion",
    "_sigma_from_alphat": "Diffusion",
    "prior_sample": "UniformState",
}


def duo_sampler(duo: types.SimpleNamespace, network: DuoNetwork, length: int) -> Any:
    """An object on which Duo's ``generate_samples(num_samples, num_steps=...)`` runs as in
    Duo: ancestral steps on the linear time grid from 1 to eps = 1e-5, float64 posteriors, no
    nucleus, no guidance, then the greedy noise-removal step (argmax of x_theta)."""
    base = duo.trainer_base
    methods = {name: getattr(getattr(base, owner), name) for name, owner in DUO_METHODS.items()}
    methods["_posterior_from_x0"] = duo.algo.DUO_BASE._posterior_from_x0
    sampling = types.SimpleNamespace(
        steps=None,
        predictor="ancestral",
        noise_removal="greedy",
        use_float64=True,
        guid_weight=None,
        p_nucleus=1.0,
        psi=types.SimpleNamespace(time_profile="linear"),
    )
    device = next(network.model.parameters()).device
    attributes = dict(
        config=types.SimpleNamespace(sampling=sampling),
        sampler="ancestral",
        noise=base.LogLinear(DELTA),
        vocab_size=len(network.support),
        num_tokens=length,
        p_nucleus=1.0,
        class_conditional=False,
        time_conditioning=True,
        device=device,
        dtype=torch.float32,
        forward=network,
    )
    stand_in_class = type("DuoModuleStandIn", (), methods)
    sampler = stand_in_class()
    sampler.__dict__.update(attributes)
    return sampler


# ---------------------------------------------------------------- bd3lms


def bd3lms_missing(path: str) -> str | None:
    folder = Path(path)
    if (folder / "diffusion.py").is_file() and (folder / "noise_schedule.py").is_file():
        return None
    return (
        f"--bd3lms {path}: expected {folder}/diffusion.py and {folder}/noise_schedule.py "
        "(a bd3lms clone)"
    )


def load_bd3lms(path: str) -> types.SimpleNamespace:
    """bd3lms's ``diffusion`` and ``noise_schedule`` modules."""
    folder = Path(path)
    with peer_imports(folder, lightning_repo_stand_ins()):
        diffusion = importlib.import_module("diffusion")
        noise_schedule = importlib.import_module("noise_schedule")
    # Its sampler draws a progress bar over the blocks at every call: the same tqdm, silenced.
    diffusion.tqdm = functools.partial(diffusion.tqdm, disable=True)
    return types.SimpleNamespace(diffusion=diffusion, noise_schedule=noise_schedule)


# The methods of bd3lms's block sampler (all on its ``Diffusion`` module).
BD3LMS_METHODS = (
    "_semi_ar_sampler",
    "_ddpm_caching_update",
    "_sample_prior",
    "_nucleus_sample",
    "_sigma_from_p",
    "_subs_parameterization",
    "_check_stop_conds",
    "_compute_entropy",
)


def bd3lms_sampler(bd3lms: types.SimpleNamespace, model: Transformer, block_size: int) -> Any:
    """An object on which bd3lms's ``_semi_ar_sampler(n_samples, num_steps, num_strides,
    seqlen)`` runs as in bd3lms with its default sampling settings (first hitting, no nucleus,
    no KV cache, fixed length): block by block, one uniformly chosen masked position per step,
    its token drawn from p(x0). Its forward is our block-diffusion model over the blocks so far
    under the block-causal mask, through bd3lms's own ``_subs_parameterization``."""
    methods = {name: getattr(bd3lms.diffusion.Diffusion, name) for name in BD3LMS_METHODS}
    stand_in_class = type("Bd3lmsModuleStandIn", (), methods)
    sampler = stand_in_class()
    device = next(model.parameters()).device

    def forward(x, sigma, sample_mode=False, store_kv=False):
        mask = block_causal_mask(x.shape[1], block_size, x.device)
        logits = model(x, attention=mask).view(*x.shape, -1).float()
        return sampler._subs_parameterization(logits=logits, xt=x)

    config = types.SimpleNamespace(
        algo=types.SimpleNamespace(name="bd3lm"),
        model=types.SimpleNamespace(length=None),
        sampling=types.SimpleNamespace(
            kv_cache=False, first_hitting=True, nucleus_p=1.0, var_length=False
        ),
    )
    sampler.__dict__.update(
        config=config,
        block_size=block_size,
        mask_index=model.config.vocab_size - 1,
        neg_infinity=-1000000.0,
        noise=bd3lms.noise_schedule.LogLinearNoise(),
        tokenizer=types.SimpleNamespace(bos_token_id=BOS, eos_token_id=None),
        device=device,
        dtype=torch.float32,
        forward=forward,
    )
    return sampler
