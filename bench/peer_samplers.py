"""Our diffusion samplers side by side with their public implementations, on the same weights.

    python bench/peer_samplers.py --fast-dllm PATH --shape demo --batch 1 --rounds 5
    python bench/peer_samplers.py --fast-dllm PATH --shape 135m --json out.json
    python bench/peer_samplers.py --fast-dllm PATH --check-only      # token identity, no timing

``--fast-dllm PATH``: a folder holding Fast-dLLM's ``llada/`` folder (NVlabs/Fast-dLLM: its
``llada/generate.py`` and ``llada/model/``), for example from
``git show HEAD:llada/generate.py > PATH/llada/generate.py`` and the same for ``llada/model/*``.
Nothing of it is copied into this project: the script imports it from PATH. It needs
``transformers`` and ``einops`` (the ``hf`` extra).

What runs: one randomly initialised MDM of the chosen shape (speed does not depend on what the
weights say), and the same weights loaded into Fast-dLLM's ``LLaDAModelLM`` under LLaDA's names
and config (``shared.formats.diffusion``, the mapping ``duolm export`` writes). For each case,
Fast-dLLM's ``generate``, ``generate_with_prefix_cache`` or ``generate_with_dual_cache`` (fixed
low-confidence, or ``threshold=``) and our ``DiffusionGenerator.fill`` with the same rule,
blocks and cache fill the same canvas (BOS + a random prompt + ``--gen-length`` masks) greedily.
The script first checks that both produce the same tokens, then times both with
``eval.throughput.measure`` (warm-up, alternating rounds, median with min and max) and reports
the paired ratio ours / theirs of tokens/s, round by round.

Where the algorithms are the same, and the one adapter: our models never predict [MASK] (SUBS;
its column is dropped before the argmax and the softmax), while Fast-dLLM's argmax and softmax
run over the whole vocabulary, [MASK] included. ``MaskColumnDropped`` wraps their model so that
the [MASK] logit is -inf in what ``model(x).logits`` returns; their sampler runs unchanged on it.
Our side uses LLaDA's split of a block's tokens over its steps (``FixedCount(split="front")``)
and float64 confidences, as Fast-dLLM does. Their ``generate`` functions build a batch of one
row (``torch.full((1, ...))``), so only ``--batch 1`` compares with Fast-dLLM.

Duo (``--duo``) and bd3lms (``--bd3lms``): not built; each prints why (``PEER_GAPS``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import FixedCount, Threshold
from eval.throughput import Record, Setting, Spread, measure
from shared.checkpoint import full_model_state
from shared.config import ModelConfig
from shared.formats.diffusion import llada_config_fields, llada_weight_name
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.training.presets import get_preset

BOS = 0

# Model shapes, before the [MASK] row the diffusion objective adds. The demo preset's shape
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

# What blocks a comparison with the other two public samplers (printed when their path is given).
PEER_GAPS = {
    "duo": (
        "not built. Duo's sampler (s-sahoo/duo: trainer_base.Diffusion.generate_samples, "
        "_ancestral_update, algo.DUO_BASE._posterior_from_x0) is a set of methods of its "
        "Lightning module: trainer_base.py imports hydra, lightning, transformers and Duo's "
        "dataloader, metrics and models at import time, and the methods read self.config "
        "(Hydra), self.noise and self.backbone. An adapter would bind those methods to a "
        "stand-in object; not written yet. Tokens cannot be identical in any case: its draws "
        "come from the global RNG (Gumbel-max with torch.rand_like), its time grid ends at "
        "eps=1e-5 rather than 0, and its greedy tail is an extra evaluation after the last step"
    ),
    "bd3lms": (
        "not built. bd3lms's sampler (kuleshov-group/bd3lms: diffusion.Diffusion._semi_ar_sampler "
        "and _ddpm_caching_update) is a set of methods of its Lightning module: diffusion.py "
        "imports hydra, lightning, transformers and bd3lms's dataloader, metrics, models and "
        "noise_schedule at import time; the methods call self.forward(x, sigma, sample_mode, "
        "store_kv) on its DiT backbone's own KV cache (reset_kv_cache) and read self.config "
        "(Hydra). An adapter is not written yet. Tokens cannot be identical in any case: its "
        "draws come from the global RNG (Gumbel-max), and it stops on its _check_stop_conds "
        "past 256 tokens"
    ),
}


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


def paired_ratio(ours: Record, theirs: Record) -> Spread:
    """Ours / theirs tokens/s, round by round (both ran in every round, one after the other):
    the median with min and max of the per-round ratios."""
    if ours.rounds != theirs.rounds:
        raise ValueError(f"{ours.name} ran {ours.rounds} rounds and {theirs.name} {theirs.rounds}")
    ratios = [
        (n_o / t_o) / (n_t / t_t)
        for n_o, t_o, n_t, t_t in zip(
            ours.round_tokens, ours.round_seconds, theirs.round_tokens, theirs.round_seconds
        )
    ]
    return Spread.of(ratios)


def first_difference(ours: torch.Tensor, theirs: torch.Tensor) -> int | None:
    """Index of the first generated position where two [1, G] token rows differ (None: equal)."""
    if ours.shape != theirs.shape:
        raise ValueError(f"shapes differ: {tuple(ours.shape)} vs {tuple(theirs.shape)}")
    differ = (ours != theirs).flatten().nonzero()
    return int(differ[0]) if len(differ) else None


def fail(why: str) -> None:
    """A user error: one line on stderr, exit status 2."""
    print(f"error: {why}", file=sys.stderr)
    raise SystemExit(2)


# ---------------------------------------------------------------- Fast-dLLM


def load_fast_dllm(path: str) -> Any:
    """Fast-dLLM's ``llada/generate.py`` as a module (its ``model`` package importable), or
    SystemExit(2) with one line saying what is missing."""
    folder = Path(path) / "llada"
    if not (folder / "generate.py").is_file() or not (folder / "model").is_dir():
        fail(
            f"--fast-dllm {path}: expected {folder}/generate.py and {folder}/model/ (a folder "
            "with Fast-dLLM's llada/ directory)"
        )
    sys.path.insert(0, str(folder))  # its generate.py imports "model.modeling_llada"
    spec = importlib.util.spec_from_file_location("fast_dllm_generate", folder / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llada_peer(model: Transformer) -> torch.nn.Module:
    """Fast-dLLM's ``LLaDAModelLM`` with ``model``'s config and weights."""
    from model.configuration_llada import LLaDAConfig
    from model.modeling_llada import LLaDAModelLM

    mask_id = model.config.vocab_size - 1
    fields = llada_config_fields(model.config, mask_id, BOS, BOS)
    peer = LLaDAModelLM(LLaDAConfig(**fields), init_params=False)
    # Their forward reads config.use_cache, which transformers 5 no longer keeps on a config
    # (LLaDA's config.json says false, as does LLaDAConfig's default).
    peer.config.use_cache = False
    weights = {llada_weight_name(n): t for n, t in full_model_state(model).items()}
    if model.config.tie_embeddings:  # LLaDA's tied head is its embedding
        weights.pop("model.transformer.ff_out.weight", None)
        weights.setdefault("model.transformer.wte.weight", model.tok_embeddings.weight)
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


# ---------------------------------------------------------------- running both


def build_model(shape: str, device: str) -> Transformer:
    config = ModelConfig(**SHAPES[shape])
    torch.manual_seed(0)
    model = Transformer(config.with_vocab(config.vocab_size + 1))  # + the [MASK] row
    return model.to(device).eval()


def run_pair(
    case: Case, args: argparse.Namespace, ours: DiffusionGenerator, theirs: Any, peer, prompt
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """Two zero-argument callables, ours and Fast-dLLM's, each returning the generated [1, G]."""
    config = our_sampler(case, args.steps, args.block_length, args.threshold)
    canvas = ours.prompt_canvas([prompt], args.gen_length)
    kwargs = fast_dllm_kwargs(
        case, args.steps, args.gen_length, args.block_length, args.threshold, ours.mask_id
    )
    function = getattr(theirs, FAST_DLLM_FUNCTIONS[case.cache])
    start = canvas.region[0]
    prefix = canvas.tokens[:, :start].to(peer.device)  # BOS + prompt

    def run_ours() -> torch.Tensor:
        return ours.fill(canvas, config, seed=0, eos="none").raw.generated

    def run_theirs() -> torch.Tensor:
        tokens, _ = function(peer, prefix, **kwargs)
        return tokens[:, start:]

    return run_ours, run_theirs


def check_identity(case: Case, run_ours, run_theirs) -> dict[str, Any]:
    ours, theirs = run_ours(), run_theirs()
    at = first_difference(ours.cpu(), theirs.cpu())
    return {"case": case.name, "identical": at is None, "first_difference": at}


def counted(run: Callable[[], torch.Tensor]) -> Callable[[], int]:
    """A ``Setting`` callable: run once, return the number of generated tokens."""
    return lambda: int(run().numel())


def time_pair(case: Case, run_ours, run_theirs, args, sync) -> dict[str, Any]:
    """Both timed by ``eval.throughput.measure`` (alternating rounds), with the paired ratio."""
    settings = [
        Setting(f"ours {case.name}", 1, counted(run_ours)),
        Setting(f"fast-dllm {case.name}", 1, counted(run_theirs)),
    ]
    result = measure(settings, rounds=args.rounds, warmup=args.warmup, sync=sync)
    ours, theirs = result.records
    return {
        "ours": ours.as_dict(),
        "theirs": theirs.as_dict(),
        "ratio": vars(paired_ratio(ours, theirs)),
        "machine": result.machine,
    }


def fast_dllm_pairs(args: argparse.Namespace, model: Transformer, theirs: Any) -> list[tuple]:
    """(case, ours, theirs) for every case: the two callables of ``run_pair`` on ``model`` and
    the same weights in Fast-dLLM's model, one random prompt of ``--prompt-length`` tokens."""
    mask_id = model.config.vocab_size - 1
    peer = MaskColumnDropped(llada_peer(model), mask_id)
    ours = DiffusionGenerator(model, eos_id=BOS)
    draws = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, mask_id, (args.prompt_length,), generator=draws).tolist()
    return [(case, *run_pair(case, args, ours, theirs, peer, prompt)) for case in CASES]


def compare_fast_dllm(args: argparse.Namespace) -> dict[str, Any]:
    theirs = load_fast_dllm(args.fast_dllm)
    model = build_model(args.shape, args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else None
    rows = []
    for case, run_ours, run_theirs in fast_dllm_pairs(args, model, theirs):
        row = check_identity(case, run_ours, run_theirs)
        at = row["first_difference"]
        same = "identical tokens" if at is None else f"tokens DIFFER from position {at}"
        print(f"fast-dllm {case.name}: {same}", flush=True)
        if not args.check_only:
            row |= time_pair(case, run_ours, run_theirs, args, sync)
        rows.append(row)
    return {"peer": "fast-dllm", "source": source_of(args.fast_dllm), "cases": rows}


def check_args(args: argparse.Namespace) -> None:
    """One line (SystemExit 2) naming the first setting that does not fit."""
    blocks, left = divmod(args.gen_length, args.block_length) if args.block_length > 0 else (0, 1)
    length = 1 + args.prompt_length + args.gen_length
    problems = [
        (args.batch != 1, f"--batch {args.batch}: Fast-dLLM's generate functions build one row "
         "(torch.full((1, ...))); only --batch 1 compares with them"),
        (args.gen_length < 1 or left != 0 or blocks < 1,
         f"--block-length {args.block_length} must divide --gen-length {args.gen_length}"),
        (blocks >= 1 and (args.steps < 1 or args.steps % blocks != 0),
         f"--steps {args.steps} must be a positive multiple of the number of blocks ({blocks})"),
        (not 0 < args.threshold <= 1, f"--threshold {args.threshold} must be in (0, 1]"),
        (args.prompt_length < 0, f"--prompt-length {args.prompt_length} must be >= 0"),
        (length > SHAPES[args.shape]["max_seq_len"],
         f"BOS + --prompt-length + --gen-length = {length} positions, more than the "
         f"{args.shape} shape's max_seq_len={SHAPES[args.shape]['max_seq_len']}"),
        (args.rounds < 1 or args.warmup < 0, f"--rounds {args.rounds} must be >= 1 and "
         f"--warmup {args.warmup} >= 0"),
    ]  # fmt: skip
    for failed, why in problems:
        if failed:
            fail(why)


# ---------------------------------------------------------------- report


def source_of(path: str) -> str:
    """What the peer folder says it is (a SOURCE file with repository and commit), or its path."""
    source = Path(path) / "SOURCE"
    return source.read_text().strip() if source.is_file() else str(Path(path).resolve())


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("transformers", "einops"):
        try:
            found[package] = importlib.import_module(package).__version__
        except ImportError:
            found[package] = None
    return found


def markdown(report: dict[str, Any]) -> str:
    """One table row per case: identity, both medians, the paired ratio."""
    lines = [
        "| case (rule / cache) | same tokens | ours tokens/s median [min, max] "
        "| theirs tokens/s median [min, max] | ours / theirs (paired) median [min, max] |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in report["cases"]:
        cells = ["-", "-", "-"]
        if "ratio" in row:
            o, t = row["ours"]["tokens_per_s"], row["theirs"]["tokens_per_s"]
            r = row["ratio"]
            cells = [
                f"{o['median']:,.0f} [{o['low']:,.0f}, {o['high']:,.0f}]",
                f"{t['median']:,.0f} [{t['low']:,.0f}, {t['high']:,.0f}]",
                f"{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}]",
            ]
        same = "yes" if row["identical"] else f"no (from position {row['first_difference']})"
        lines.append(f"| {row['case']} | {same} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast-dllm", default=None, help="folder with Fast-dLLM's llada/")
    parser.add_argument("--duo", default=None, help="a clone of s-sahoo/duo (not built yet)")
    parser.add_argument("--bd3lms", default=None, help="a clone of bd3lms (not built yet)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64, help="fixed rule: steps in all")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--check-only", action="store_true", help="token identity, no timing")
    parser.add_argument("--json", default=None, help="also write the report here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    torch.set_num_threads(args.threads)
    # Identical tokens need the same float32 arithmetic on both sides: no TF32 matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report: dict[str, Any] = {"shape": args.shape, "settings": vars(args), "versions": versions()}
    skipped = {}
    if args.fast_dllm is None:
        skipped["fast-dllm"] = "no --fast-dllm PATH given (a folder with Fast-dLLM's llada/)"
    else:
        report["fast-dllm"] = compare_fast_dllm(args)
        print()
        print(markdown(report["fast-dllm"]))
    for name, path in (("duo", args.duo), ("bd3lms", args.bd3lms)):
        skipped[name] = f"no --{name} PATH given" if path is None else PEER_GAPS[name]
    report["skipped"] = skipped
    for name, why in skipped.items():
        print(f"- {name}: skipped: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
