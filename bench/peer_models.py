"""Other implementations of our AR model for ``bench/train_peers.py``, each at our backbone's
config with a copy of our weights, and each with its own library's training loss.

- Hugging Face ``transformers.LlamaForCausalLM``: the config and the weight names come from
  ``arlm.export`` (the mapping the export uses); loss through ``labels=``, as its docs train it.
- litgpt's ``GPT`` (an optional extra, see ``litgpt_modules``): LLaMA-style settings (RMSNorm,
  ``LLaMAMLP`` SwiGLU, full rotary, grouped queries, no biases, sequential residual); loss by
  ``litgpt.utils.chunked_cross_entropy`` on inputs ``row[:-1]`` and targets ``row[1:]``, as
  ``litgpt pretrain`` does.

Every loss function here takes a batch of token rows [B, T] and returns the mean cross-entropy
over the same scored positions as our AR loss (every position after BOS that is not padding).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import torch
from torch import nn

from arlm.export import llama_model
from shared.config import ModelConfig
from shared.model import Transformer
from shared.objective import loss_positions

IGNORE = -100  # the label both libraries skip

# litgpt without its declared dependencies (they pin huggingface-hub<1.4, which would downgrade
# the one transformers needs); the imports of litgpt.model are all in the "bench" extra.
LITGPT_INSTALL = 'pip install -e ".[bench]" && pip install --no-deps "litgpt==0.5.13"'

LossFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def masked_labels(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``tokens`` with every position our AR loss does not score (BOS, padding) set to -100."""
    return tokens.masked_fill(~loss_positions(tokens, pad_id), IGNORE)


# ---------------------------------------------------------------- Hugging Face


def hf_llama(model: Transformer) -> nn.Module:
    """``LlamaForCausalLM`` with ``model``'s config and weights, SDPA attention, no KV cache
    (a training forward)."""
    return llama_model(model, attn_implementation="sdpa", use_cache=False).train()


def hf_loss(pad_id: int) -> LossFn:
    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=masked_labels(tokens, pad_id)).loss

    return loss


# ---------------------------------------------------------------- litgpt


def litgpt_modules() -> tuple[Any, str]:
    """(litgpt's model module, its version) or (None, why it cannot be used). Never raises: a
    broken install is a reason to skip, not a crash."""
    try:
        import litgpt.model
        import litgpt.utils

        return litgpt.model, version("litgpt")
    except Exception as error:  # ImportError, or a dependency at an incompatible version
        return None, f"litgpt is not importable ({type(error).__name__}: {error}); {LITGPT_INSTALL}"


def litgpt_config(cfg: ModelConfig) -> dict[str, Any]:
    """``litgpt.Config`` keyword arguments closest to our backbone (the same math: only the
    rotary tables' rounding differs, litgpt computing them in float32)."""
    if cfg.sliding_window:
        raise ValueError(f"sliding_window={cfg.sliding_window} has no litgpt counterpart here")
    return dict(
        name="duolm",
        block_size=cfg.max_seq_len,
        n_layer=cfg.n_layers,
        n_embd=cfg.dim,
        vocab_size=cfg.vocab_size,
        padded_vocab_size=cfg.vocab_size,  # no padding: the same output head as ours
        norm_class_name="RMSNorm",
        norm_eps=cfg.norm_eps,
        parallel_residual=False,
        shared_attention_norm=False,
        n_head=cfg.n_heads,
        head_size=cfg.head_dim,
        n_query_groups=cfg.n_kv_heads,
        bias=False,
        lm_head_bias=False,
        rotary_percentage=1.0,
        rope_base=int(cfg.rope_theta) if float(cfg.rope_theta).is_integer() else cfg.rope_theta,
        mlp_class_name="LLaMAMLP",
        intermediate_size=cfg.hidden_dim,
    )


def litgpt_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under litgpt's names (q, k, v fused into one ``qkv`` in that order)."""
    ours = {k: v.detach().clone() for k, v in model.state_dict().items()}
    weights = {
        "transformer.wte.weight": ours["tok_embeddings.weight"],
        "transformer.ln_f.weight": ours["norm.weight"],
        "lm_head.weight": ours["output.weight"],
    }
    for i in range(model.config.n_layers):
        a, b = f"layers.{i}.", f"transformer.h.{i}."
        attention = [ours[f"{a}attention.{w}.weight"] for w in ("wq", "wk", "wv")]
        weights |= {
            f"{b}norm_1.weight": ours[f"{a}attention_norm.weight"],
            f"{b}attn.qkv.weight": torch.cat(attention),
            f"{b}attn.proj.weight": ours[f"{a}attention.wo.weight"],
            f"{b}norm_2.weight": ours[f"{a}ffn_norm.weight"],
            f"{b}mlp.fc_1.weight": ours[f"{a}feed_forward.w1.weight"],
            f"{b}mlp.fc_2.weight": ours[f"{a}feed_forward.w3.weight"],
            f"{b}mlp.proj.weight": ours[f"{a}feed_forward.w2.weight"],
        }
    return weights


def litgpt_gpt(model: Transformer) -> nn.Module:
    """litgpt's ``GPT`` at ``model``'s config with its weights (raises when litgpt is absent)."""
    litgpt_model, why = litgpt_modules()
    if litgpt_model is None:
        raise ImportError(why)
    gpt = litgpt_model.GPT(litgpt_model.Config(**litgpt_config(model.config)))
    if model.config.tie_embeddings:  # litgpt has no tying switch; share the tensor as we do
        gpt.lm_head.weight = gpt.transformer.wte.weight
    gpt.load_state_dict(litgpt_weights(model), strict=True)
    return gpt.train()


def litgpt_loss(pad_id: int) -> LossFn:
    import litgpt.utils

    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        targets = masked_labels(tokens, pad_id)[:, 1:]
        return litgpt.utils.chunked_cross_entropy(model(tokens[:, :-1]), targets)

    return loss


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
