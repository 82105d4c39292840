"""Our diffusion samplers side by side with their public implementations, on the same weights.

    python bench/peer_samplers.py --fast-dllm PATH --duo PATH --bd3lms PATH --shape demo \
        --batch 1 --rounds 5 --json out.json
    python bench/peer_samplers.py --fast-dllm PATH --duo PATH --bd3lms PATH --check-only
    python bench/peer_samplers.py --remdm PATH --duo PATH --steps 80 --rounds 5 --json out.json

Each peer runs from a folder the user gives; nothing of it is copied into this project, the
adapters in ``bench/peer_adapters.py`` import it from there (``transformers`` and ``einops``, the
``hf`` extra, are needed for Fast-dLLM's model code). A peer without a path is skipped with the
reason. For every case the script first checks the two implementations against each other, then
times both with ``eval.speed.throughput.measure`` (warm-up, alternating rounds, median with min and
max) and reports the paired ratio ours / theirs of tokens/s, round by round. The models are
randomly initialised at the chosen shape (speed does not depend on what the weights say).

- ``--fast-dllm PATH``: a folder holding Fast-dLLM's ``llada/`` (NVlabs/Fast-dLLM:
  ``llada/generate.py``, ``llada/model/``). An MDM, and the same weights in Fast-dLLM's
  ``LLaDAModelLM`` under LLaDA's names and config (the mapping ``duolm export`` writes). Cases:
  fixed low-confidence and threshold decoding, each without a cache and with the approximate
  prefix and dual caches: Fast-dLLM's ``generate``, ``generate_with_prefix_cache``,
  ``generate_with_dual_cache`` against our ``DiffusionGenerator.fill`` with the same rule, blocks
  and cache, greedy, on BOS + a random prompt + ``--gen-length`` masks. Check: identical tokens.
  The same algorithm on both sides, with one adapter: our models never predict [MASK] (SUBS),
  while Fast-dLLM's argmax and softmax include its column, so its logit is set to -inf in what
  their ``model(x).logits`` returns. Our side uses LLaDA's split of a block's tokens over its
  steps (``FixedCount(split="front")``) and float64 confidences, as Fast-dLLM does. Their
  functions build one row (``torch.full((1, ...))``): Fast-dLLM needs ``--batch 1``.
- ``--duo PATH``: a Duo clone (s-sahoo/duo). A time-conditioned udm model, and Duo's
  ``generate_samples`` (ancestral steps, float64 posteriors, greedy noise removal) bound
  unchanged to a stand-in of its Lightning module whose forward is our model, against our
  ``sample_uniform`` with the greedy tail, at the same NFE: Duo's ``--steps - 1`` ancestral
  steps (grid 1 to 1e-5) plus its greedy step, our ``--steps`` steps (grid 1 to 0, the last
  greedy). Duo has no prompt: it generates every position (BOS's slot too), ours keeps BOS.
  A second case, Duo's Psi sampler (``predictor=psi``, kappas of mode max-capped-0.01 at every
  step, ancestral noise removal) against our ``psi="cap"``, ``eta=0.01``, at the same NFE
  (``bench/peer_correctors.py``); there only ``--gen-length`` tokens a row are counted on
  both sides.
- ``--bd3lms PATH``: a bd3lms clone (kuleshov-group/bd3lms). A block-diffusion model with
  ``--block-length`` blocks, and bd3lms's ``_semi_ar_sampler`` at its default settings (first
  hitting: one uniformly chosen masked position per step; no nucleus; ``kv_cache`` off, as its
  cached path calls its DiT backbone's own cache) bound unchanged to a stand-in whose forward is
  our model through bd3lms's own ``_subs_parameterization``, against our ``FixedCount(random)``
  at one token per step (the same rule), with our exact KV cache of finished blocks and
  without it. Both generate ``--gen-length - 1`` tokens (bd3lms puts BOS in the first block).
- ``--remdm PATH``: a ReMDM clone (kuleshov-group/remdm). A masked model (not time-conditioned,
  as ReMDM's released MDLM), and ReMDM's ``_sample`` (the ``ddpm_cache`` predictor with its
  p(x0) cache, greedy noise removal, no nucleus) bound unchanged to a stand-in whose forward is
  our model through ReMDM's own ``_subs_parameterization``, against our ``Remdm`` rule through
  ``DiffusionGenerator.fill``. Two cases at ReMDM's released knobs: cap (eta 0.008) and loop
  (eta 0.02, t_on 0.55, t_off 0.05, alpha_on 0.9); the same NFE: ReMDM's ``--steps - 1`` steps
  (grid 1 to 1e-5) plus its noise removal, our ``--steps`` steps (grid 1 to 0). ReMDM
  generates BOS's slot too; only ``--gen-length`` tokens a row are counted on both sides.
  ``--steps`` must be a multiple of 20, so that the loop's t_on and t_off lie on the grid the
  check walks.

Duo's, bd3lms's and ReMDM's tokens cannot equal ours (their draws come from the global RNG by
Gumbel-max); what is checked instead is in ``bench/peer_checks.py`` and, for ReMDM and Duo's Psi
sampler, ``bench/peer_correctors.py``: along one trajectory of ``--steps`` steps, their update's
distribution of x_s (captured from the Gumbel-max draw it calls) against ours from the same
p(x0), x_t and times, to 1e-12 (ReMDM) and 1e-6 (Psi: Duo's eta is a float32 tensor).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_adapters
import peer_correctors
from peer_cases import (
    SHAPES,
    Pair,
    bd3lms_pairs,
    build_model,
    duo_pair,
    fast_dllm_pairs,
)

from eval.speed.throughput import Record, Setting, Spread, measure
from shared.cli_args import CommandParser
from shared.door import write_atomic


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


def fail(why: str) -> None:
    """A user error: one line on stderr, exit status 2."""
    print(f"error: {why}", file=sys.stderr)
    raise SystemExit(2)


# ---------------------------------------------------------------- measuring


def time_pair(pair: Pair, args: argparse.Namespace, sync) -> dict[str, Any]:
    """Both timed by ``eval.speed.throughput.measure`` (alternating rounds), with the paired
    ratio."""
    settings = [
        Setting(f"ours {pair.case}", args.batch, pair.ours),
        Setting(f"{pair.peer} {pair.case}", args.batch, pair.theirs),
    ]
    result = measure(settings, rounds=args.rounds, warmup=args.warmup, sync=sync)
    ours, theirs = result.records
    return {
        "ours": ours.as_dict(),
        "theirs": theirs.as_dict(),
        "ratio": vars(paired_ratio(ours, theirs)),
        "machine": result.machine,
    }


def compare(pairs: list[Pair], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Check every pair, then (unless ``--check-only``) time it."""
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else None
    rows = []
    for pair in pairs:
        row = {"peer": pair.peer, "case": pair.case, **pair.check()}
        print(f"{pair.peer} {pair.case}: {row['what']}", flush=True)
        if not args.check_only:
            row |= time_pair(pair, args, sync)
        rows.append(row)
    return rows


def check_args(args: argparse.Namespace) -> None:
    """One line (SystemExit 2) naming the first setting that does not fit."""
    blocks, left = divmod(args.gen_length, args.block_length) if args.block_length > 0 else (0, 1)
    length = 1 + args.prompt_length + args.gen_length
    max_len = SHAPES[args.shape]["max_seq_len"]
    problems = [
        (args.fast_dllm is not None and args.batch != 1,
         f"--batch {args.batch}: Fast-dLLM's generate functions build one row "
         "(torch.full((1, ...))); only --batch 1 compares with them"),
        (args.bd3lms is not None and args.batch != 1,
         f"--batch {args.batch}: bd3lms's first-hitting sampler takes one row (its "
         "validation asserts eval_batch_size == 1); only --batch 1 compares with it"),
        (args.batch < 1, f"--batch {args.batch} must be >= 1"),
        (args.gen_length < 1 or left != 0 or blocks < 1,
         f"--block-length {args.block_length} must divide --gen-length {args.gen_length}"),
        (blocks >= 1 and (args.steps < 1 or args.steps % blocks != 0),
         f"--steps {args.steps} must be a positive multiple of the number of blocks ({blocks})"),
        (args.duo is not None and args.steps < 2,
         f"--steps {args.steps}: Duo's comparison needs at least 2 (its greedy step is one)"),
        (args.remdm is not None and args.steps % 20 != 0,
         f"--steps {args.steps}: ReMDM's loop (t_on 0.55, t_off 0.05) is compared step by step "
         "only with both on the step grid; use a multiple of 20 (e.g. 80)"),
        (not 0 < args.threshold <= 1, f"--threshold {args.threshold} must be in (0, 1]"),
        (args.prompt_length < 0, f"--prompt-length {args.prompt_length} must be >= 0"),
        (length > max_len,
         f"BOS + --prompt-length + --gen-length = {length} positions, more than the "
         f"{args.shape} shape's max_seq_len={max_len}"),
        (args.rounds < 1 or args.warmup < 0, f"--rounds {args.rounds} must be >= 1 and "
         f"--warmup {args.warmup} >= 0"),
    ]  # fmt: skip
    for failed, why in problems:
        if failed:
            fail(why)


# ---------------------------------------------------------------- report


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("transformers", "einops"):
        try:
            found[package] = importlib.import_module(package).__version__
        except ImportError:
            found[package] = None
    return found


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table row per case: the check, both medians, the paired ratio."""
    lines = [
        "| peer | case | check | ours tokens/s median [min, max] "
        "| theirs tokens/s median [min, max] | ours / theirs (paired) median [min, max] |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cells = ["-", "-", "-"]
        if "ratio" in row:
            o, t = row["ours"]["tokens_per_s"], row["theirs"]["tokens_per_s"]
            r = row["ratio"]
            cells = [
                f"{o['median']:,.0f} [{o['low']:,.0f}, {o['high']:,.0f}]",
                f"{t['median']:,.0f} [{t['low']:,.0f}, {t['high']:,.0f}]",
                f"{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}]",
            ]
        lines.append(
            f"| {row['peer']} | {row['case']} | {row['what']} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast-dllm", default=None, help="folder with Fast-dLLM's llada/")
    parser.add_argument("--duo", default=None, help="a clone of s-sahoo/duo")
    parser.add_argument("--bd3lms", default=None, help="a clone of kuleshov-group/bd3lms")
    parser.add_argument("--remdm", default=None, help="a clone of kuleshov-group/remdm")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=16, help="Fast-dLLM cases")
    parser.add_argument(
        "--steps", type=int, default=64, help="steps (fixed rule) / NFE (Duo, ReMDM)"
    )
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--prompt-length", type=int, default=16, help="Fast-dLLM cases")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--check-only", action="store_true", help="checks only, no timing")
    parser.add_argument("--json", default=None, help="also write the report here")
    return parser.parse_args(argv)


def peer_pairs(args: argparse.Namespace) -> tuple[list[Pair], dict[str, str], dict[str, str]]:
    """(pairs to compare, the sources of the peers used, the reasons the others are skipped)."""
    pairs: list[Pair] = []
    sources: dict[str, str] = {}
    skipped: dict[str, str] = {}
    if args.fast_dllm is None:
        skipped["fast-dllm"] = "no --fast-dllm PATH given (a folder with Fast-dLLM's llada/)"
    else:
        fail_if(peer_adapters.fast_dllm_missing(args.fast_dllm))
        fast_dllm = peer_adapters.load_fast_dllm(args.fast_dllm)
        model = build_model(args.shape, args.device, extra_rows=1)
        pairs += fast_dllm_pairs(args, model, fast_dllm)
        sources["fast-dllm"] = peer_adapters.source_of(args.fast_dllm)
    if args.duo is None:
        skipped["duo"] = "no --duo PATH given (a clone of s-sahoo/duo)"
    else:
        fail_if(peer_adapters.duo_missing(args.duo))
        duo = peer_adapters.load_duo(args.duo)
        pairs += [duo_pair(args, duo), peer_correctors.duo_psi_pair(args, duo)]
        sources["duo"] = peer_adapters.source_of(args.duo)
    if args.bd3lms is None:
        skipped["bd3lms"] = "no --bd3lms PATH given (a clone of kuleshov-group/bd3lms)"
    else:
        fail_if(peer_adapters.bd3lms_missing(args.bd3lms))
        pairs += bd3lms_pairs(args, peer_adapters.load_bd3lms(args.bd3lms))
        sources["bd3lms"] = peer_adapters.source_of(args.bd3lms)
    if args.remdm is None:
        skipped["remdm"] = "no --remdm PATH given (a clone of kuleshov-group/remdm)"
    else:
        fail_if(peer_correctors.remdm_missing(args.remdm))
        pairs += peer_correctors.remdm_pairs(args, peer_correctors.load_remdm(args.remdm))
        sources["remdm"] = peer_adapters.source_of(args.remdm)
    return pairs, sources, skipped


def fail_if(why: str | None) -> None:
    if why is not None:
        fail(why)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    torch.set_num_threads(args.threads)
    # Identical tokens need the same float32 arithmetic on both sides: no TF32 matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    pairs, sources, skipped = peer_pairs(args)
    rows = compare(pairs, args)
    if rows:
        print()
        print(markdown(rows))
    for name, why in skipped.items():
        print(f"- {name}: skipped: {why}")
    if args.json:
        report = {
            "shape": args.shape,
            "settings": vars(args),
            "versions": versions(),
            "sources": sources,
            "rows": rows,
            "skipped": skipped,
        }
        write_atomic(Path(args.json), json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
