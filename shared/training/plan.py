"""``duolm plan``: what a preset costs before the spend. Parameters, FLOPs per token, memory per
device under DDP and FSDP2, and the time to a FLOP budget, from the preset alone (nothing is
trained or downloaded).

    duolm plan --preset small --gpus 8 --mfu 0.4 --flops 1e20 --gpu-memory-gib 80

The formulas, and what they assume:

* FLOPs per token (training, forward + backward): ``6 * N_matmul + 12 * n_layers * dim *
  seq_len`` (``shared.model.flops_per_token``): 6 per weight of every matmul, the output head
  included (N_matmul excludes the embedding lookup), plus the attention score and value
  products counted as full (causal masking is not discounted).
* Model state per parameter: fp32 weights (4 bytes), fp32 gradients (4) and AdamW's two fp32
  moments (8): 16 bytes, as this trainer keeps them (bf16 runs autocast the matmuls; the master
  weights stay fp32). DDP holds all of it on every device, plus its fp32 gradient buckets (4
  bytes per parameter) when there is more than one process. FSDP2 shards the 16 bytes over the
  devices and gathers one block's weights at a time (two blocks counted: the one computing and
  the one prefetched), in the compute precision.
* Activations of the rows one device holds at once (``batch_size / (gpus * grad_accum)``): per
  layer and token, the tensors autograd keeps for the backward pass: the residual stream and
  the two RMSNorms (6 x dim, fp32), the attention's q, k, v, output and output projection
  input (3 x q_dim + 2 x kv_dim) and the SwiGLU's four hidden-width tensors (4 x hidden_dim),
  the last two groups in the compute precision. Attention is a fused kernel (flash or flex)
  that keeps no seq_len x seq_len matrix; a sliding window on CPU (math attention) does, and
  the plan says it leaves that out. The output head adds the logits, their fp32
  log-softmax and its gradient: (compute bytes + 4 + 4) x vocab per token.
* Time: total FLOPs / (gpus x peak FLOP/s x MFU).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any

import torch

from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.errors import ConfigError, human_size, report_user_errors
from shared.hardware import GPU_PEAK_BF16
from shared.model import Transformer, flops_per_token
from shared.training.presets import get_preset, resolve_config

GIB = 2**30
# Tokenizer vocabularies a preset may name, known without loading the tokenizer (specials in).
KNOWN_VOCABS = {"byte": 258, "gpt2": 50258, "hf:bert-base-uncased": 30522}
BYTES = {"bf16": 2, "fp32": 4}
STATE_BYTES_PER_PARAMETER = 16  # fp32 weights + fp32 gradients + AdamW's two fp32 moments
DDP_BUCKET_BYTES_PER_PARAMETER = 4  # DDP's fp32 gradient buckets (more than one process)
DEFAULT_PEAK = GPU_PEAK_BF16["H100"]


@dataclass(frozen=True)
class PlanRequest:
    preset: str
    gpus: int
    mfu: float = 0.4
    flops: float = 1e20
    gpu_memory_gib: float = 80.0
    peak_tflops: float = DEFAULT_PEAK / 1e12
    precision: str = "bf16"
    vocab_size: int = 0  # 0: the preset's tokenizer's, when known
    grad_accum: int = 0  # 0: the preset's

    def validate(self) -> PlanRequest:
        get_preset(self.preset)  # an unknown preset is refused, naming the valid ones
        if self.gpus < 1:
            raise ConfigError(f"--gpus {self.gpus} must be >= 1")
        if not 0 < self.mfu <= 1:
            raise ConfigError(f"--mfu {self.mfu} must be in (0, 1] (a fraction of the peak)")
        for name in ("flops", "gpu_memory_gib", "peak_tflops"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ConfigError(f"--{name.replace('_', '-')} {value} must be finite and > 0")
        if self.precision not in BYTES:
            raise ConfigError(f"--precision {self.precision!r} is not one of {sorted(BYTES)}")
        if self.vocab_size < 0 or self.grad_accum < 0:
            raise ConfigError("--vocab-size and --grad-accum must be >= 0 (0: the preset's)")
        return self


def preset_vocab(train: Any, given: int) -> int:
    if given:
        return given
    if train.tokenizer == "bpe":
        return train.tokenizer_vocab_size
    if train.tokenizer in KNOWN_VOCABS:
        return KNOWN_VOCABS[train.tokenizer]
    raise ConfigError(
        f"the vocabulary of tokenizer {train.tokenizer!r} is not known without loading it; "
        "give --vocab-size"
    )


def count_parameters(model_cfg: ModelConfig) -> tuple[int, int]:
    """(all parameters, the largest block's) of the backbone, built on the meta device (no
    memory, no weights)."""
    with torch.device("meta"):
        model = Transformer(model_cfg)
    block = max(sum(p.numel() for p in layer.parameters()) for layer in model.layers)
    return model.num_parameters(), block


def activation_bytes(model_cfg: ModelConfig, rows: int, seq_len: int, precision: str) -> float:
    """Bytes autograd keeps for the backward pass of ``rows`` rows (the module docstring)."""
    tokens = rows * seq_len
    compute = BYTES[precision]
    q_dim = model_cfg.n_heads * model_cfg.head_dim
    kv_dim = model_cfg.n_kv_heads * model_cfg.head_dim
    per_layer = 4 * 6 * model_cfg.dim + compute * (
        3 * q_dim + 2 * kv_dim + 4 * model_cfg.hidden_dim
    )
    head = (compute + 4 + 4) * model_cfg.vocab_size
    return tokens * (model_cfg.n_layers * per_layer + head)


def make_plan(request: PlanRequest) -> dict[str, Any]:
    """Every number ``duolm plan`` prints, as a dict."""
    request = request.validate()
    preset = get_preset(request.preset)
    model_cfg, train = resolve_config(request.preset, {})
    model_cfg = model_cfg.with_vocab(preset_vocab(train, request.vocab_size)).validate()
    parameters, block = count_parameters(model_cfg)
    grad_accum = request.grad_accum or train.grad_accum
    rows = train.batch_size / (request.gpus * grad_accum)
    per_token = flops_per_token(model_cfg, train.seq_len)
    activations = activation_bytes(model_cfg, max(1, int(rows)), train.seq_len, request.precision)
    state = STATE_BYTES_PER_PARAMETER * parameters
    buckets = DDP_BUCKET_BYTES_PER_PARAMETER * parameters if request.gpus > 1 else 0
    gathered = 2 * block * BYTES[request.precision] if request.gpus > 1 else 0
    ddp = {"state": state, "ddp_buckets": buckets, "activations": activations}
    fsdp = {"state": state / request.gpus, "gathered_blocks": gathered, "activations": activations}
    peak = request.peak_tflops * 1e12
    seconds = request.flops / (request.gpus * peak * request.mfu)
    tokens = request.flops / per_token
    return {
        "preset": request.preset,
        "model": {k: getattr(model_cfg, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads")}
        | {"hidden_dim": model_cfg.hidden_dim, "vocab_size": model_cfg.vocab_size},
        "sliding_window": model_cfg.sliding_window,
        "parameters": parameters,
        "seq_len": train.seq_len,
        "batch_size": train.batch_size,
        "grad_accum": grad_accum,
        "rows_per_device": rows,
        "flops_per_token": per_token,
        "precision": request.precision,
        "memory": {
            "DDP": ddp | {"total": sum(ddp.values())},
            "FSDP2": fsdp | {"total": sum(fsdp.values())},
        },
        "gpu_memory": request.gpu_memory_gib * GIB,
        "budget_flops": request.flops,
        "budget_tokens": tokens,
        "budget_steps": tokens / (train.batch_size * train.seq_len),
        "gpus": request.gpus,
        "mfu": request.mfu,
        "peak_flops": peak,
        "seconds": seconds,
        "preset_train": preset["train"],
    }


def describe(plan: dict[str, Any]) -> list[str]:
    """The plan as the lines ``duolm plan`` prints."""
    m = plan["model"]
    lines = [
        f"preset {plan['preset']}: dim {m['dim']}, {m['n_layers']} layers, {m['n_heads']} heads "
        f"({m['n_kv_heads']} kv), hidden {m['hidden_dim']}, vocab {m['vocab_size']}",
        f"parameters: {plan['parameters']:,} ({plan['parameters'] / 1e6:,.2f}M)",
        f"FLOPs per token: {plan['flops_per_token']:.4g} = 6 x N_matmul + 12 x layers x dim x "
        f"seq_len (seq_len {plan['seq_len']}; attention counted as full)",
        f"batch: {plan['batch_size']} rows x {plan['seq_len']} tokens, grad_accum "
        f"{plan['grad_accum']}, {plan['rows_per_device']:g} rows per device at once",
        f"memory per device ({plan['precision']} compute; fp32 weights, gradients and AdamW "
        "moments = 16 bytes/parameter):",
    ]
    if plan["rows_per_device"] < 1 or plan["rows_per_device"] % 1:
        lines.append(
            f"  note: batch_size {plan['batch_size']} does not split into whole rows over "
            f"{plan['gpus']} GPUs x grad_accum {plan['grad_accum']}; training refuses it"
        )
    for layout, parts in plan["memory"].items():
        shown = ", ".join(
            f"{k.replace('_', ' ')} {human_size(v)}" for k, v in parts.items() if k != "total"
        )
        fits = "fits" if parts["total"] <= plan["gpu_memory"] else "DOES NOT FIT"
        room = human_size(plan["gpu_memory"])
        lines.append(f"  {layout:<5} {human_size(parts['total'])} ({shown}): {fits} in {room}")
    if plan["sliding_window"]:
        lines.append(
            "  note: a sliding window runs math attention on CPU, which keeps a seq_len^2 matrix "
            "per head not counted here (a GPU's flex attention keeps none)"
        )
    hours = plan["seconds"] / 3600
    lines += [
        f"budget {plan['budget_flops']:.3g} FLOPs = {plan['budget_tokens']:.4g} tokens = "
        f"{plan['budget_steps']:,.0f} steps of this batch",
        f"time: {hours:,.1f} h ({hours / 24:,.2f} days) on {plan['gpus']} GPU(s) at "
        f"{plan['peak_flops'] / 1e12:g} TFLOP/s peak each and MFU {plan['mfu']:g} "
        "(FLOPs / (gpus x peak x MFU))",
    ]
    return lines


def build_parser() -> CommandParser:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilisation")
    parser.add_argument("--flops", type=float, default=1e20, help="training FLOP budget")
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0)
    parser.add_argument(
        "--peak-tflops", type=float, default=DEFAULT_PEAK / 1e12, help="per GPU (H100 bf16 dense)"
    )
    parser.add_argument("--precision", default="bf16", choices=sorted(BYTES))
    parser.add_argument("--vocab-size", type=int, default=0, help="0: the preset tokenizer's")
    parser.add_argument("--grad-accum", type=int, default=0, help="0: the preset's")
    return parser


def request_from(args: argparse.Namespace) -> PlanRequest:
    return PlanRequest(**vars(args))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_user_errors(lambda: print("\n".join(describe(make_plan(request_from(args))))))


if __name__ == "__main__":
    sys.exit(main())
