"""Diffusion sampling speed: every sampler and cache beside KV-cached AR decoding.

    python bench/diffusion_sampling.py             # 128 and 256 new tokens (~2-3 min, 2 cores)
    python bench/diffusion_sampling.py --quick     # 128 new tokens, fewer settings (~30 s)
    python bench/diffusion_sampling.py --checkpoint runs/demo/mdm --ar-checkpoint runs/demo/ar

One masked-diffusion model of the ``demo`` preset's shape (d=256, 4 layers, 4 heads; vocabulary
2048 + [MASK]) built with max_seq_len=512, randomly initialised unless ``--checkpoint`` gives
trained weights (loaded into the longer model: RoPE tables are not part of the weights), and an
AR model of the same shape for comparison. Every row: batch 1, a 16-token prompt, G generated
tokens, one sample per setting (after one untimed warm-up of the whole script), or the best of
``--repeats`` runs.

Columns: NFE (network evaluations; with a cache each one is a partial forward), wall time per
sample, generated tokens per second, and ms per evaluation. Speed depends on the weights only
through NFE, and only for the threshold rule, whose step count falls as the model grows
confident: a random model (confidence ~1/2048) shows it at its worst, one token per step. The
ancestral sampler's p(x0)-cache savings depend on the steps per token, not on the weights (steps
that reveal nothing reuse the last evaluation). AR decoding uses ``arlm.generate`` (KV cache,
greedy, EOS ignored so it generates exactly G tokens); while that module is not importable a
minimal KV-cached greedy loop stands in, and the header says which ran.

Timing is ``eval.speed.throughput.measure``, the project's one generation timing: at each G every
setting (and the AR) is one ``Setting`` of batch 1, timed in ``--repeats`` rounds with the order
rotated each round, no warm-up rounds (the script warmed up once for all); a row is a setting's
fastest round.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arlm.generate import GenerationConfig, generate
from dllm.canvas import Canvas
from dllm.generator import DiffusionGenerator, DiffusionResult
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, FixedCount, Threshold
from eval.speed.throughput import Setting, measure
from shared.checkpoint import load_weights, read_state, resolve_checkpoint
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.hardware import cpu_name
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.training.presets import get_preset

TOKENIZER_VOCAB = 2048  # the demo preset's BPE, specials included
PROMPT_LENGTH = 16
MAX_SEQ_LEN = 512
BLOCK = 32
AR_ROW = "AR greedy, KV cache"


@dataclass
class Row:
    gen_length: int
    name: str
    nfe: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.gen_length / self.seconds

    @property
    def ms_per_nfe(self) -> float:
        return 1000 * self.seconds / self.nfe


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 tokens, fewer settings")
    parser.add_argument("--checkpoint", default=None, help="trained MDM weights (demo shape)")
    parser.add_argument("--ar-checkpoint", default=None, help="trained AR weights (demo shape)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs")
    return parser.parse_args()


def build_model(vocab: int, checkpoint: str | None) -> Transformer:
    """The demo shape with max_seq_len=512; trained weights when a checkpoint is given."""
    shape = {**get_preset("demo-d256")["model"], "vocab_size": vocab}
    if checkpoint is not None:
        path = resolve_checkpoint(Path(checkpoint))
        shape = read_state(path)["model_config"]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**shape, "max_seq_len": MAX_SEQ_LEN}))
    if checkpoint is not None:
        load_weights(path, model)
    return model.eval()


def settings(gen_length: int, quick: bool) -> list[tuple[str, SamplerConfig]]:
    """(label, config) pairs: each sampler at several step counts, with and without caches."""
    g = gen_length
    block = {"block_length": BLOCK}
    greedy = SamplingConfig(temperature=0)
    step_counts = [g, g // 4] if quick else [g, g // 2, g // 4]
    rows = []
    for steps in step_counts:
        rows.append((f"ancestral steps={steps}", SamplerConfig(Ancestral(steps))))
    rows.append(
        (
            f"ancestral steps={g} no p(x0) reuse",
            SamplerConfig(Ancestral(g), reuse_predictions=False),
        )
    )
    if not quick:
        rows.append((f"ancestral steps={4 * g}", SamplerConfig(Ancestral(4 * g))))
    for steps in step_counts:
        for cache in ("none", "approx_prefix", "approx_dual"):
            config = SamplerConfig(FixedCount(steps), sampling=greedy, cache=cache, **block)
            rows.append((f"fixed low_conf steps={steps} block={BLOCK} cache={cache}", config))
    if not quick:
        rows.append((f"fixed low_conf steps={g} one block", SamplerConfig(FixedCount(g))))
        rows.append(
            (
                f"fixed random steps={g} block={BLOCK}",
                SamplerConfig(FixedCount(g, "random"), **block),
            )
        )
    for cache in ("none", "approx_prefix", "approx_dual"):
        config = SamplerConfig(Threshold(0.9), sampling=greedy, cache=cache, **block)
        rows.append((f"threshold 0.9 block={BLOCK} cache={cache}", config))
    if not quick:
        config = SamplerConfig(FixedCount(g), cfg_scale=1.0, **block)
        rows.append((f"fixed low_conf steps={g} block={BLOCK} cfg=1.0", config))
    return rows


def sample_once(
    generator: DiffusionGenerator, config: SamplerConfig, canvas: Canvas
) -> DiffusionResult:
    # A fresh seed: every repeat is the same run. No EOS policy: the model is random.
    return generator.fill(canvas, config, seed=0, eos="none")


def fastest_rounds(
    runs: dict[str, Callable[[], object]], gen_length: int, repeats: int
) -> dict[str, tuple[float, object]]:
    """(seconds of the fastest round, the last output) per name: every run timed by
    ``measure`` in ``repeats`` alternating rounds, each generating ``gen_length`` tokens."""
    outputs: dict[str, object] = {}

    def setting(name: str, run: Callable[[], object]) -> Setting:
        def once() -> int:
            outputs[name] = run()
            return gen_length

        return Setting(name, 1, once)

    timed = measure([setting(n, r) for n, r in runs.items()], rounds=repeats, warmup=0)
    return {r.name: (min(r.round_seconds), outputs[r.name]) for r in timed.records}


def ar_decode(model: Transformer, prompt: list[int], gen_length: int) -> tuple[int, str]:
    """(forward passes, engine label) of KV-cached greedy decoding of ``gen_length`` tokens."""
    config = GenerationConfig(
        max_new_tokens=gen_length, sampling=SamplingConfig(temperature=0), stop_on_eos=False
    )
    result = generate(model, [prompt], config)
    return result.forward_passes, "arlm.generate (KV cache, greedy)"


def machine() -> str:
    cpu = cpu_name()
    return (
        f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}; "
        f"python {platform.python_version()}, torch {torch.__version__}"
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    repeats = args.repeats
    gen_lengths = [128] if args.quick else [128, 256]
    bos = TOKENIZER_VOCAB - 2  # <|endoftext|> of the demo BPE
    mdm = DiffusionGenerator(build_model(TOKENIZER_VOCAB + 1, args.checkpoint), eos_id=bos)
    ar = build_model(TOKENIZER_VOCAB, args.ar_checkpoint)
    prompt = torch.randint(0, TOKENIZER_VOCAB - 2, (PROMPT_LENGTH,), generator=seeded(1)).tolist()

    # Warm-up: the first forwards of each shape pay for allocation and kernel selection.
    warm = mdm.prompt_canvas([prompt], 32)
    for cache in ("none", "approx_dual"):
        sample_once(mdm, SamplerConfig(FixedCount(8), block_length=8, cache=cache), warm)
    ar_decode(ar, [bos, *prompt], 8)

    rows: list[Row] = []
    ar_engine = ""
    started = time.perf_counter()
    for g in gen_lengths:
        canvas = mdm.prompt_canvas([prompt], g)
        runs = {
            label: partial(sample_once, mdm, config, canvas)
            for label, config in settings(g, args.quick)
        }
        runs[AR_ROW] = partial(ar_decode, ar, [bos, *prompt], g)
        timed = fastest_rounds(runs, g, repeats)
        for label, (seconds, result) in timed.items():
            if label == AR_ROW:
                passes, ar_engine = result
                rows.append(Row(g, AR_ROW, passes, seconds))
                continue
            tag = " (APPROXIMATE)" if result.approximate else ""
            rows.append(Row(g, f"MDM {label}{tag}", result.nfe, seconds))
            print(f"  {rows[-1].name} G={g}: {seconds:.2f} s, NFE {result.nfe}", file=sys.stderr)
    total = time.perf_counter() - started

    weights = "trained: " + args.checkpoint if args.checkpoint else "random init"
    ar_weights = "trained: " + args.ar_checkpoint if args.ar_checkpoint else "random init"
    print(f"machine: {machine()}")
    print(
        f"MDM weights {weights}; AR weights {ar_weights}; AR engine: {ar_engine}; prompt "
        f"{PROMPT_LENGTH} tokens, batch 1, best of {repeats}; whole run {total:.0f} s\n"
    )
    print("| G | sampler | NFE | s / sample | tokens/s | ms / NFE |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row.gen_length} | {row.name} | {row.nfe} | {row.seconds:.2f} | "
            f"{row.tokens_per_s:.0f} | {row.ms_per_nfe:.1f} |"
        )


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


if __name__ == "__main__":
    main()
