"""Generation throughput of AR and masked-diffusion samplers, measured by ``eval.speed.throughput``:
the one measurement the report and the frontier use.

    python bench/generation_throughput.py                     # batches 1 and 32 (~2 min, 1 thread)
    python bench/generation_throughput.py --batches 1,64 --rounds 5 --json out.json

Two randomly initialised models of the ``demo`` preset's shape (d=128, 4 layers, window 8,
vocabulary 512; the MDM has the extra [MASK] row): speed does not depend on what the weights say,
except through the threshold sampler's step count (one token per step on a random model, see
docs/diffusion-sampling.md). Every setting generates ``--gen-length`` tokens per row from BOS,
EOS ignored, so the numerator is batch x length generated tokens. After ``--warmup`` untimed
rounds, ``--rounds`` rounds run every setting once, round-robin with the order rotated each
round; each record is the median tokens/s with its min and max, and seconds per sample. A batch
that does not fit in memory ends the list with one line naming the largest that fitted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arlm.generate import GenerationConfig, generate
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, FixedCount, Threshold
from eval.speed.throughput import measure_batches
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.door import write_atomic
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.training.presets import get_preset

VOCAB = 512  # the demo preset's BPE
BOS = 0


def model(vocab: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**get_preset("demo")["model"], "vocab_size": vocab})).eval()


def settings(gen_length: int) -> dict[str, SamplerConfig | None]:
    """Name -> diffusion sampler (None: KV-cached AR decoding at temperature 1)."""
    return {
        "ar T=1 (KV cache)": None,
        "mdm ancestral 16 steps": SamplerConfig(Ancestral(16)),
        "mdm fixed low-conf 16 steps": SamplerConfig(FixedCount(16)),
        f"mdm threshold 0.9 (= {gen_length} steps here)": SamplerConfig(Threshold(0.9)),
    }


def main() -> None:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the records here")
    args = parser.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches {args.batches!r} must be comma-separated integers")
    torch.set_num_threads(args.threads)
    length = args.gen_length
    ar = model(VOCAB)
    mdm = DiffusionGenerator(model(VOCAB + 1), eos_id=BOS)
    configs = settings(length)
    ar_config = GenerationConfig(
        max_new_tokens=length, stop_on_eos=False, sampling=SamplingConfig()
    )

    def make(name: str, batch: int):
        config = configs[name]
        if config is None:
            prompts = [[BOS]] * batch
            return lambda: generate(ar, prompts, ar_config, eos_id=BOS, seed=0).new_tokens
        canvas = mdm.prompt_canvas([[]] * batch, length)
        return lambda: sum(len(r) for r in mdm.fill(canvas, config, seed=0, eos="none").tokens)

    try:
        result = measure_batches(
            make, list(configs), batches, rounds=args.rounds, warmup=args.warmup
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"demo shape, random weights, {length} generated tokens per row from BOS\n")
    print(result.markdown())
    if args.json:
        write_atomic(Path(args.json), json.dumps(result.as_dict(), indent=2))


if __name__ == "__main__":
    main()
