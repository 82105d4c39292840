"""How many tokens the confidence-threshold sampler reveals per step, against the fixed
low-confidence sampler at one token per step on the same seed.

    python bench/threshold_reveals.py                          # random-init demo-shape MDM
    python bench/threshold_reveals.py --checkpoint runs/demo/mdm --thresholds 0.9,0.7,0.5

``Threshold(tau)`` reveals, at each step, every masked position whose drawn token has model
probability >= tau, plus the single most confident position. ``FixedCount(G)`` with
low-confidence remasking over G positions reveals exactly that most confident position. Both
draw the same tokens from the same per-row streams as long as the same positions are masked, so
the two give *identical samples* whenever no step of a row has two or more positions at or above
tau: a weak model (random weights, or the demo's 0.94M-parameter MDM at tau = 0.9) decodes one
token per step either way. This script counts, per setting: steps taken, tokens revealed per
step (mean, max), steps where two or more positions passed tau, steps where the best position
passed tau, the largest confidence seen, and how many rows equal the fixed sampler's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dllm.generator import DiffusionGenerator
from dllm.masked.sampler import block_bounds, build_predictor
from dllm.predictors import CountingModel
from dllm.sampler import SamplerConfig, row_generators, run
from dllm.strategies import FixedCount, StepContext, Threshold, token_probability
from shared.cli_args import CommandParser, seed_argument
from shared.config import ModelConfig
from shared.model import Transformer
from shared.training.presets import get_preset


@dataclass
class CountingThreshold:
    """``Threshold`` with a record of each step's confidences (the sampling loop calls ``step``
    exactly as it calls the rule's)."""

    rule: Threshold
    passed: list[torch.Tensor] = field(default_factory=list)  # [B] positions >= tau per step
    best: list[torch.Tensor] = field(default_factory=list)  # [B] best masked confidence
    name: ClassVar[str] = "threshold"

    def steps_per_block(self, n_blocks: int) -> int | None:
        return None

    def step(self, ctx: StepContext):
        reveal, tokens = self.rule.step(ctx)
        scores = token_probability(ctx.probs, tokens)
        masked_scores = torch.where(ctx.masked, scores, torch.zeros_like(scores))
        self.passed.append(((scores >= self.rule.threshold) & ctx.masked).sum(-1).cpu())
        self.best.append(masked_scores.max(-1).values.cpu())
        return reveal, tokens


def decode(model, config: SamplerConfig, canvas, seed: int):
    counter = CountingModel(model)
    predictor = build_predictor(counter, config, canvas)
    blocks = block_bounds(canvas.region, config.block_length)
    generators = row_generators(torch.Generator().manual_seed(seed), canvas.batch_size)
    return run(predictor, counter, config, canvas, blocks, generators)


def load(checkpoint: str | None) -> DiffusionGenerator:
    """The checkpoint's model with its BOS id, or a random demo-shape model (BOS 0)."""
    if checkpoint is not None:
        generator = DiffusionGenerator.from_checkpoint(checkpoint)
        generator.model.eval()
        return generator
    torch.manual_seed(0)
    shape = {**get_preset("demo")["model"], "vocab_size": 513}  # BPE 512 + [MASK]
    return DiffusionGenerator(Transformer(ModelConfig(**shape)).eval(), eos_id=0)


def main() -> None:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="an mdm run or checkpoint folder")
    parser.add_argument("--thresholds", default="0.9,0.5,0.2")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=seed_argument, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = load(args.checkpoint)
    model, g = engine.model, args.gen_length
    canvas = engine.prompt_canvas([[]] * args.batch, g)
    fixed = decode(model, SamplerConfig(FixedCount(g)), canvas, args.seed)
    source = args.checkpoint or "random init, demo shape (vocabulary 512 + [MASK])"
    print(f"model: {source}; batch {args.batch}, {g} generated tokens, seed {args.seed}")
    print(f"fixed low-confidence {g} steps: {fixed.steps} steps, NFE {fixed.nfe}\n")
    print(
        "| threshold | steps | tokens / step (mean, max) | steps with >= 2 passing | "
        "steps whose best passes | largest confidence | rows equal to fixed |"
    )
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for tau in [float(t) for t in args.thresholds.split(",")]:
        rule = CountingThreshold(Threshold(tau))
        result = decode(model, SamplerConfig(rule), canvas, args.seed)  # type: ignore[arg-type]
        revealed = result.revealed[result.revealed.sum(-1) > 0]  # steps, rows
        active = revealed[revealed > 0].double()
        passed = torch.stack(rule.passed)
        best = torch.stack(rule.best)
        equal = (result.generated == fixed.generated).all(-1).sum().item()
        print(
            f"| {tau:g} | {result.steps} | {active.mean():.2f}, {int(active.max())} | "
            f"{int((passed >= 2).sum())} | {int((best >= tau).sum())} | "
            f"{best.max():.3f} | {equal} / {args.batch} |"
        )


if __name__ == "__main__":
    main()
