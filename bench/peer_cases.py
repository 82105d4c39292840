"""The cases ``bench/peer_samplers.py`` runs: the model shapes, and for each peer the pairs of
one sampler setting run by our sampler and by the peer's on the same weights, each with the check
that the two agree (identical tokens for Fast-dLLM, equal step distributions for Duo, a matched
first-hitting distribution for bd3lms)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_adapters
import peer_checks
from peer_adapters import BOS

from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount, Threshold
from dllm.uniform.sampler import UniformSamplerConfig
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.training.presets import get_preset

# Model shapes, before the [MASK] row the masked objectives add. The demo preset's shape
# without its sliding window (LLaDA's format has none), and SmolLM2-135M's config.
SHAPES: dict[str, dict[str, Any]] = {
    "demo": {**get_preset("demo")["model"], "vocab_size": 512, "sliding_window": 0},
    "135m": dict(
        vocab_size=49152,
        dim=576,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        hidden_dim=1536,
        norm_eps=1e-5,
        rope_theta=100000.0,
        max_seq_len=2048,
        tie_embeddings=True,
    ),
}


@dataclass
class Pair:
    """One case run by both implementations: ``ours`` and ``theirs`` generate once and return
    how many tokens they generated; ``check`` compares the two and returns {"passed": bool,
    "what": one line}."""

    peer: str
    case: str
    ours: Callable[[], int]
    theirs: Callable[[], int]
    check: Callable[[], dict[str, Any]]


# ---------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """One sampler setting run by both implementations."""

    rule: str  # "fixed" (low-confidence, a fixed count per step) or "threshold"
    cache: str  # "none", "approx_prefix", "approx_dual"

    @property
    def name(self) -> str:
        return f"{self.rule} / {self.cache}"


# Fast-dLLM's generate function for each of our caches (the same algorithm each).
FAST_DLLM_FUNCTIONS = {
    "none": "generate",
    "approx_prefix": "generate_with_prefix_cache",
    "approx_dual": "generate_with_dual_cache",
}
CASES = [Case(rule, cache) for rule in ("fixed", "threshold") for cache in FAST_DLLM_FUNCTIONS]


def our_sampler(case: Case, steps: int, block_length: int, threshold: float) -> SamplerConfig:
    """Our sampler configured as Fast-dLLM's ``case``: greedy, LLaDA's front-loaded split."""
    rule = FixedCount(steps, split="front") if case.rule == "fixed" else Threshold(threshold)
    return SamplerConfig(
        rule,
        block_length=block_length,
        sampling=SamplingConfig(temperature=0.0),
        cache=case.cache,
    ).validate()


def fast_dllm_kwargs(
    case: Case, steps: int, gen_length: int, block_length: int, threshold: float, mask_id: int
) -> dict[str, Any]:
    """Keyword arguments of Fast-dLLM's generate functions for ``case`` (greedy)."""
    return dict(
        steps=steps,
        gen_length=gen_length,
        block_length=block_length,
        temperature=0.0,
        remasking="low_confidence",
        mask_id=mask_id,
        threshold=threshold if case.rule == "threshold" else None,
    )


# ---------------------------------------------------------------- Fast-dLLM


def build_model(shape: str, device: str, *, extra_rows: int, time: bool = False) -> Transformer:
    """A random model of ``shape`` with ``extra_rows`` vocabulary rows added ([MASK]: 1)."""
    config = ModelConfig(**{**SHAPES[shape], "time_conditioning": time})
    torch.manual_seed(0)
    model = Transformer(config.with_vocab(config.vocab_size + extra_rows))
    return model.to(device).eval()


def random_prompt(length: int, high: int) -> list[int]:
    draws = torch.Generator().manual_seed(0)
    return torch.randint(1, high, (length,), generator=draws).tolist()


def fast_dllm_pair(case: Case, args, ours: DiffusionGenerator, fast_dllm, peer, prompt) -> Pair:
    """Ours and Fast-dLLM's ``case`` on the same canvas; the check compares their tokens."""
    config = our_sampler(case, args.steps, args.block_length, args.threshold)
    canvas = ours.prompt_canvas([prompt], args.gen_length)
    kwargs = fast_dllm_kwargs(
        case, args.steps, args.gen_length, args.block_length, args.threshold, ours.mask_id
    )
    function = getattr(fast_dllm.generate, FAST_DLLM_FUNCTIONS[case.cache])
    start = canvas.region[0]
    prefix = canvas.tokens[:, :start].to(peer.device)  # BOS + prompt

    def run_ours() -> torch.Tensor:
        return ours.fill(canvas, config, seed=0, eos="none").raw.generated

    def run_theirs() -> torch.Tensor:
        tokens, _ = function(peer, prefix, **kwargs)
        return tokens[:, start:]

    def check() -> dict[str, Any]:
        at = peer_checks.first_difference(run_ours().cpu(), run_theirs().cpu())
        what = "identical tokens" if at is None else f"tokens differ from position {at}"
        return {"passed": at is None, "what": what, "first_difference": at}

    return Pair("fast-dllm", case.name, counted(run_ours), counted(run_theirs), check)


def fast_dllm_pairs(args: argparse.Namespace, model: Transformer, fast_dllm) -> list[Pair]:
    """Every case on ``model`` and the same weights in Fast-dLLM's model."""
    mask_id = model.config.vocab_size - 1
    peer = peer_adapters.MaskColumnDropped(peer_adapters.llada_peer(fast_dllm, model, BOS), mask_id)
    ours = DiffusionGenerator(model, eos_id=BOS)
    prompt = random_prompt(args.prompt_length, mask_id)
    return [fast_dllm_pair(case, args, ours, fast_dllm, peer, prompt) for case in CASES]


def counted(run: Callable[[], torch.Tensor]) -> Callable[[], int]:
    """A ``Setting`` callable: run once, return the number of generated tokens."""
    return lambda: int(run().numel())


# ---------------------------------------------------------------- Duo


def duo_pair(args: argparse.Namespace, duo) -> Pair:
    """Ours and Duo's ancestral sampler with a greedy last step, the same NFE (``--steps``)."""
    pad = SHAPES[args.shape]["vocab_size"] - 1  # the support is every id but padding
    model = build_model(args.shape, args.device, extra_rows=0, time=True)
    ours = DiffusionGenerator(model, state={"objective": "udm"}, eos_id=BOS, pad_id=pad)
    canvas = ours.prompt_canvas([[]] * args.batch, args.gen_length)
    config = UniformSamplerConfig(steps=args.steps, greedy_tail=True)
    network = peer_adapters.DuoNetwork(model, pad)
    sampler = peer_adapters.duo_sampler(duo, network, canvas.length)

    def run_ours() -> torch.Tensor:
        return ours.fill(canvas, config, seed=0, eos="none").raw.generated

    def run_theirs() -> torch.Tensor:
        return sampler.generate_samples(args.batch, num_steps=args.steps - 1)

    def check() -> dict[str, Any]:
        gap = peer_checks.posterior_gap(sampler, network, canvas.length, args.batch, args.steps)
        same = "equal" if gap < peer_checks.POSTERIOR_TOLERANCE else "DIFFER"
        what = (
            f"step distributions {same} (largest difference {gap:.1e}); tokens not "
            "comparable (different random streams)"
        )
        return {
            "passed": gap < peer_checks.POSTERIOR_TOLERANCE,
            "what": what,
            "posterior_gap": gap,
        }

    name = f"ancestral {args.steps} NFE, greedy tail"
    return Pair("duo", name, counted(run_ours), counted(run_theirs), check)


# ---------------------------------------------------------------- bd3lms


def bd3lms_pairs(args: argparse.Namespace, bd3lms) -> list[Pair]:
    """Our block sampler (exact KV cache, and without it) and bd3lms's, one token per step in a
    uniformly random order, temperature 1, on BOS + ``--gen-length - 1`` tokens (bd3lms puts BOS
    in the first block)."""
    block = args.block_length
    model = build_model(args.shape, args.device, extra_rows=1)
    state = {"objective": "bd", "train_config": {"block_size": block}}
    ours = DiffusionGenerator(model, state=state, eos_id=BOS)
    canvas = ours.prompt_canvas([[]], args.gen_length - 1)
    blocks = args.gen_length // block
    config = SamplerConfig(FixedCount(blocks * block, remasking="random"))
    sampler = peer_adapters.bd3lms_sampler(bd3lms, model, block)
    check_result: dict[str, Any] = {}

    def run_ours(kv_cache: bool) -> Callable[[], torch.Tensor]:
        return lambda: ours.fill(canvas, config, eos="none", kv_cache=kv_cache).raw.generated

    @torch.no_grad()
    def run_theirs() -> torch.Tensor:
        tokens, _ = sampler._semi_ar_sampler(1, block, blocks, args.gen_length)
        return tokens[:, 1:]

    def check() -> dict[str, Any]:
        if not check_result:
            check_result.update(peer_checks.first_hitting_check(bd3lms))
        p_theirs, p_ours = check_result["p_theirs"], check_result["p_ours"]
        fits = min(p_theirs, p_ours) >= peer_checks.CHECK_P_VALUE
        what = (
            f"first-hitting distribution {'matched' if fits else 'NOT matched'} on a tiny "
            f"model (chi-square p: theirs {p_theirs:.2g}, ours {p_ours:.2g}); tokens not "
            "comparable (different random streams)"
        )
        return {"passed": fits, "what": what, **check_result}

    name = f"first hitting, block {block}"
    theirs = counted(run_theirs)
    return [
        Pair("bd3lms", f"{name}, ours KV-cached", counted(run_ours(True)), theirs, check),
        Pair("bd3lms", f"{name}, ours uncached", counted(run_ours(False)), theirs, check),
    ]
