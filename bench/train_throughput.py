"""Training throughput of the AR and MDM objectives on the same backbone, measured in one run.

    python bench/train_throughput.py [--preset demo-d256] [--rounds 12] [--precision auto]
                                      [--threads 2]

Both models are built from the preset (same shapes, same batch of real rows from the preset's
corpus); timed optimizer steps alternate AR, MDM, AR, MDM, ... so machine noise hits both alike.
Reports median tokens/s per objective, their ratio, achieved TFLOP/s by the config's FLOP count,
and the machine and versions.

Not timed by ``eval.speed.throughput.measure``: it times generation (a call that returns
generated tokens), and a timed call here is an optimizer step (forward, backward, AdamW) on
data tokens, its noise seeded by the step's index.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.data.corpus import load_corpus
from shared.data.rows import tokenize_corpus
from shared.hardware import bf16_is_fast, cpu_name
from shared.model import Transformer, flops_per_token
from shared.objective import build_objective
from shared.tokenizer import Tokenizer
from shared.tokenizer_cache import build_tokenizer
from shared.training.config import DEFAULT_CACHE
from shared.training.presets import get_preset
from shared.training.schedule import batch_generator


def preset_batch(
    preset_name: str, device: str = "cpu"
) -> tuple[dict[str, dict[str, Any]], Tokenizer, torch.Tensor]:
    """The preset, its tokenizer, and its first batch of real training rows [batch_size,
    seq_len] (packed rows of the preset's corpus): what every configuration is timed on."""
    preset = get_preset(preset_name)
    cfg = preset["train"]
    corpus = load_corpus(cfg["dataset"])
    tokenizer = build_tokenizer(
        cfg["tokenizer"],
        vocab_size=cfg.get("tokenizer_vocab_size"),
        train_texts=corpus.train,
        corpus_fingerprint=corpus.fingerprint,
        cache_dir=DEFAULT_CACHE,
    )
    rows = tokenize_corpus(
        corpus, tokenizer, protocol="packed", seq_len=cfg["seq_len"], cache_dir=DEFAULT_CACHE
    )["train"].tokens
    batch = torch.as_tensor(rows[: cfg["batch_size"]], dtype=torch.long, device=device)
    return preset, tokenizer, batch


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__)
    parser.add_argument("--preset", default="demo-d256")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def build_runs(preset: dict, tokenizer, device: str) -> dict[str, tuple]:
    """For the AR and the MDM: (objective, model, optimizer, FLOPs per token), both models
    from the same seed."""
    runs = {}
    for name in ("ar", "mdm"):
        objective = build_objective(name, pad_id=tokenizer.pad_id)
        model_cfg = ModelConfig(**preset["model"]).with_vocab(
            objective.model_vocab_size(tokenizer.vocab_size)
        )
        torch.manual_seed(0)
        model = Transformer(model_cfg).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        seq_len = preset["train"]["seq_len"]
        runs[name] = (objective, model, optimizer, flops_per_token(model_cfg, seq_len))
    return runs


def timed_step(run: tuple, batch: torch.Tensor, index: int, use_bf16: bool) -> float:
    """Seconds of one training step (noise, loss, backward, optimizer) on ``batch``."""
    objective, model, optimizer, _ = run
    device = batch.device.type
    start = time.perf_counter()
    noise = objective.sample_noise(len(batch), batch.shape[1], batch_generator(0, index))
    with torch.autocast(device, dtype=torch.bfloat16, enabled=use_bf16):
        out = objective.loss(model, batch, noise)
    (out.nats / out.n_tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    preset, tokenizer, batch = preset_batch(args.preset, device)
    use_bf16 = args.precision == "bf16" or (args.precision == "auto" and bf16_is_fast())
    runs = build_runs(preset, tokenizer, device)
    times: dict[str, list[float]] = {"ar": [], "mdm": []}
    for index in range(args.warmup + args.rounds):
        for name in ("ar", "mdm"):
            elapsed = timed_step(runs[name], batch, index, use_bf16)
            if index >= args.warmup:
                times[name].append(elapsed)
    tokens = batch.numel()
    print(
        f"machine: {cpu_name()}, {torch.get_num_threads()} threads, device {device}; "
        f"python {platform.python_version()}, torch {torch.__version__}; "
        f"precision {'bf16' if use_bf16 else 'fp32'}"
    )
    print(
        f"preset {args.preset}: batch {len(batch)} x {batch.shape[1]} tokens, "
        f"{args.rounds} alternating timed steps per objective after {args.warmup} warm-up\n"
    )
    print("| objective | median step (s) | tokens/s | achieved TFLOP/s |")
    print("| --- | --- | --- | --- |")
    speed = {}
    for name in ("ar", "mdm"):
        median = statistics.median(times[name])
        speed[name] = tokens / median
        print(
            f"| {name} | {median:.3f} | {speed[name]:,.0f} | "
            f"{speed[name] * runs[name][3] / 1e12:.3f} |"
        )
    print(f"\nMDM / AR tokens/s: {speed['mdm'] / speed['ar']:.3f}")


if __name__ == "__main__":
    main()
