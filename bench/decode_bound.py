"""How close batch-1 greedy decoding comes to the memory bound: each new token must read every
matmul weight and the KV cache once, so no engine can take less than (bytes read) / (read
bandwidth) per token.

    python bench/decode_bound.py                    # shapes demo-d256 and small, contexts 128/512
    python bench/decode_bound.py --shapes demo-d256 --contexts 128 --new-tokens 16 --repeats 2

For each preset shape (random fp32 weights, max_seq_len 1024; demo-d256 with the demo's
2,050-token vocabulary, small with GPT-2's 50,257 and tied embeddings) and context length C, our
``ARGenerator`` greedily decodes K tokens after a random prompt of C - K tokens, best of R runs.
The step time is 1 / decode tokens/s. Bytes per step: every linear layer's weight (the output
head included), the norm weights, one embedding row, and the keys and values of the C / 2 slots
cached on average, all fp32. Read bandwidth is measured in the same run with ``torch.sum`` over
a buffer of exactly that many bytes (best of many): the rate at which this machine can stream the
step's bytes at best, from whichever cache level holds them. A 1 GiB buffer gives the DRAM rate
for reference. The fraction is bound / step time: 1.0 would be a decode step doing nothing but
streaming its weights. Run it on an idle machine.

Not timed by ``eval.speed.throughput.measure``: it times a whole generation call, prefill
included, and the bound needs the decode step alone (the engine's own decode tokens/s) and the
best ``torch.sum`` over a buffer.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arlm.generate import ARGenerator, GenerationConfig
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.hardware import cpu_name
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.training.presets import get_preset

VOCAB = {"demo-d256": 2050, "small": 50257}  # the demo's BPE; GPT-2 BPE
FLOAT_BYTES = 4


@dataclass
class Bound:
    shape: str
    parameters: int
    context: int
    step_ms: float
    bytes_per_step: int
    read_gb_s: float  # torch.sum over a buffer of bytes_per_step

    @property
    def bound_ms(self) -> float:
        return self.bytes_per_step / (self.read_gb_s * 1e9) * 1e3

    @property
    def fraction(self) -> float:
        return self.bound_ms / self.step_ms


def model_for(shape: str, vocab: int | None = None) -> Transformer:
    fields = {**get_preset(shape)["model"], "max_seq_len": 1024}
    torch.manual_seed(0)
    return Transformer(ModelConfig(**fields, vocab_size=vocab or VOCAB[shape])).eval()


def bytes_per_step(model: Transformer, context: int) -> int:
    """fp32 bytes one batch-1 decode step reads at a KV cache of ``context`` slots: the matmul
    and norm weights, one embedding row, and the cached keys and values."""
    cfg = model.config
    weights = sum(
        p.numel() for name, p in model.named_parameters() if name != "tok_embeddings.weight"
    )
    if cfg.tie_embeddings:  # the output head is the embedding matrix, read whole
        weights += cfg.vocab_size * cfg.dim
    weights += cfg.dim  # the embedding row of the input token
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * context
    return (weights + kv) * FLOAT_BYTES


def read_bandwidth(n_bytes: int, seconds: float = 0.5) -> float:
    """Best bytes/s of ``torch.sum`` over an fp32 buffer of ``n_bytes``."""
    buffer = torch.randn(max(n_bytes // FLOAT_BYTES, 1))
    buffer.sum()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - t)
    return buffer.numel() * FLOAT_BYTES / best


def decode_step_seconds(engine: ARGenerator, context: int, new_tokens: int, repeats: int) -> float:
    """1 / best decode tokens/s of greedy batch-1 decoding of ``new_tokens`` after a random
    prompt of ``context - new_tokens`` tokens."""
    vocab = engine.model.config.vocab_size
    generator = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, vocab, (1, context - new_tokens), generator=generator).tolist()
    config = GenerationConfig(
        max_new_tokens=new_tokens, sampling=SamplingConfig(temperature=0), stop_on_eos=False
    )
    engine.generate(prompt, config)  # warm-up
    rates = [engine.generate(prompt, config).decode_tokens_per_s for _ in range(repeats)]
    return 1 / max(rates)


def measure(
    shape: str, contexts: list[int], new_tokens: int, repeats: int, vocab: int | None = None
) -> list[Bound]:
    model = model_for(shape, vocab)
    engine = ARGenerator(model, eos_id=None)
    rows = []
    for context in contexts:
        if not new_tokens < context <= model.config.max_seq_len:
            raise SystemExit(
                f"context {context} must exceed --new-tokens={new_tokens} and be at most "
                f"{model.config.max_seq_len}"
            )
        step = decode_step_seconds(engine, context, new_tokens, repeats)
        n_bytes = bytes_per_step(model, context - new_tokens // 2)
        rows.append(
            Bound(
                shape=shape,
                parameters=model.num_parameters(),
                context=context,
                step_ms=step * 1e3,
                bytes_per_step=n_bytes,
                read_gb_s=read_bandwidth(n_bytes) / 1e9,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="demo-d256,small")
    parser.add_argument("--contexts", default="128,512")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = [
        row
        for shape in args.shapes.split(",")
        for row in measure(shape, contexts, args.new_tokens, args.repeats)
    ]
    print(
        f"machine: {cpu_name()}, {args.threads} threads; python {platform.python_version()}, "
        f"torch {torch.__version__}; DRAM read (1 GiB torch.sum): "
        f"{read_bandwidth(1 << 30) / 1e9:.1f} GB/s"
    )
    print(f"greedy batch-1 decode, fp32, K={args.new_tokens} new tokens, best of {args.repeats}\n")
    print(
        "| shape | parameters | context | step ms | MB read per step "
        "| read GB/s at that size | bound ms | fraction of bound |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r.shape} | {r.parameters / 1e6:.1f}M | {r.context} | {r.step_ms:.2f} "
            f"| {r.bytes_per_step / 1e6:.1f} | {r.read_gb_s:.1f} | {r.bound_ms:.2f} "
            f"| {r.fraction:.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
