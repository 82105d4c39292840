"""Export an AR checkpoint as a Hugging Face ``LlamaForCausalLM`` folder, and load one back.

The backbone is Llama module for module (``tests/test_model.py`` checks the logits), so the
export is a renaming of weights plus a config. The folder holds

- ``config.json``, ``generation_config.json``, ``model.safetensors`` (``save_pretrained``);
- ``tokenizer.json``, ``tokenizer_config.json`` (a fast tokenizer with ``<|endoftext|>`` as
  BOS/EOS and ``<|pad|>`` as padding at our ids, adding BOS in front of every text as our
  training rows have it, left padding for batched generation, and literal special-token text in
  the input tokenized as plain text, as ours does);
- ``duolm_tokenizer/``: our own tokenizer files, which the loader uses to get our exact
  ``Tokenizer`` back;
- ``duolm_export.json``: where the weights came from.

The byte tokenizer has no ``tokenizers`` backend of its own. It is exported as a byte-level BPE
without merges whose vocabulary maps GPT-2's printable stand-in for byte b to id b, so the
Hugging Face tokenizer turns text into exactly our ids (the UTF-8 bytes) and decodes them back.

``transformers`` is needed for exporting only; loading back reads the safetensors and the
config directly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import CommandParser
from shared.config import ModelConfig
from shared.errors import ConfigError, report_user_errors
from shared.model import Transformer
from shared.tokenizer import EOS_TOKEN, PAD_TOKEN, Tokenizer, is_hf_kind
from shared.tokenizer_backends import bytes_to_unicode
from shared.training.run_folder import holder_if_locked, holds_run, move_aside

TOKENIZER_DIR = "duolm_tokenizer"
EXPORT_INFO = "duolm_export.json"

# our module names -> Llama's, inside each transformer block
_BLOCK_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_weight_name(name: str) -> str:
    """Our parameter name -> the ``LlamaForCausalLM`` one."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    if not name.startswith("layers."):
        raise ValueError(f"parameter {name!r} has no Llama counterpart")
    for ours, theirs in _BLOCK_NAMES.items():
        name = name.replace(f".{ours}.", f".{theirs}.")
    return "model." + name


def our_weight_name(name: str) -> str:
    """The ``LlamaForCausalLM`` parameter name -> ours (inverse of ``hf_weight_name``)."""
    for ours, theirs in _TOP_NAMES.items():
        if name == theirs:
            return ours
    if not name.startswith("model.layers."):
        raise ValueError(f"Llama parameter {name!r} has no counterpart in our Transformer")
    name = name.removeprefix("model.")
    for ours, theirs in _BLOCK_NAMES.items():
        name = name.replace(f".{theirs}.", f".{ours}.")
    return name


def llama_config_fields(cfg: ModelConfig, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments describing our backbone."""
    if cfg.sliding_window:
        raise ValueError(
            f"sliding_window={cfg.sliding_window}: Llama has no sliding-window attention, so "
            "only models with sliding_window=0 can be exported"
        )
    fields: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        # transformers 5 reads the rotary settings from rope_parameters
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )
    if tokenizer is not None:
        fields.update(
            bos_token_id=tokenizer.eos_id,
            eos_token_id=tokenizer.eos_id,
            pad_token_id=tokenizer.pad_id,
        )
    return fields


def model_config_from_llama(config: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` from a Llama ``config.json``; refuses features we do not have."""
    if config.get("model_type") != "llama":
        raise ValueError(f"model_type={config.get('model_type')!r}: only 'llama' folders load")
    expected = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    for name, value in expected.items():
        if config.get(name, value) != value:
            raise ValueError(f"{name}={config[name]!r} is not supported (only {value!r})")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_type={rope_type!r} is not supported (only 'default')")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim * heads != config["hidden_size"]:
        raise ValueError(
            f"head_dim={head_dim} x num_attention_heads={heads} != hidden_size="
            f"{config['hidden_size']}: our attention needs head_dim = hidden_size / heads"
        )
    return ModelConfig(
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=config.get("num_key_value_heads") or heads,
        hidden_dim=config["intermediate_size"],
        norm_eps=config["rms_norm_eps"],
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        max_seq_len=config["max_position_embeddings"],
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    ).validate()


def _require_transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "exporting to Hugging Face needs the optional dependency transformers: "
            'pip install -e ".[hf]"'
        ) from error
    return transformers


# ---------------------------------------------------------------- tokenizer


def hf_tokenizer(tokenizer: Tokenizer, saved_dir: Path, max_length: int):
    """A ``PreTrainedTokenizerFast`` equal to ``tokenizer``: same ids for every text (literal
    special-token text included), the two specials at our ids, BOS added in front of every text,
    left padding.

    Our own kinds name the specials ``<|endoftext|>`` and ``<|pad|>``; an ``hf:`` tokenizer
    keeps its own names for them (e.g. ``[SEP]``/``[PAD]``), and gets ``<|pad|>`` only when we
    appended a padding id to its vocabulary. ``saved_dir`` holds ``tokenizer.save``'s files (the
    tokenizer.json is read from there, so nothing private of ``Tokenizer`` is touched)."""
    transformers = _require_transformers()

    if tokenizer.kind == "byte":
        to_char = bytes_to_unicode()
        backend = Backend(models.BPE(vocab={to_char[b]: b for b in range(256)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
    else:
        backend = Backend.from_file(str(saved_dir / "tokenizer.json"))
    eos_name, pad_name = EOS_TOKEN, PAD_TOKEN
    if is_hf_kind(tokenizer.kind):
        eos_name = backend.id_to_token(tokenizer.eos_id)
        pad_name = backend.id_to_token(tokenizer.pad_id) or PAD_TOKEN
    # (re)register both as special: skipped when decoding, never split by the model's rules
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in (eos_name, pad_name)]
    )
    for token, wanted in ((eos_name, tokenizer.eos_id), (pad_name, tokenizer.pad_id)):
        got = backend.token_to_id(token)
        if got != wanted:
            raise ValueError(f"{token} landed at id {got} in the exported tokenizer, not {wanted}")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{eos_name} $A",
        pair=f"{eos_name} $A {eos_name} $B",
        special_tokens=[(eos_name, tokenizer.eos_id)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=eos_name,
        eos_token=eos_name,
        pad_token=pad_name,
        padding_side="left",
        model_max_length=max_length,
        # like ours, treat a literal "<|endoftext|>" in user text as text, never as the special
        split_special_tokens=True,
    )


# ---------------------------------------------------------------- export


def llama_model(model: Transformer, tokenizer: Tokenizer | None = None, **config: Any):
    """A ``LlamaForCausalLM`` of ``model``'s shape holding a copy of its weights (on the CPU).
    ``config``: further ``LlamaConfig`` settings (``attn_implementation``, ``use_cache``)."""
    transformers = _require_transformers()
    cfg = model.config
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**llama_config_fields(cfg, tokenizer), **config)
    )
    weights = {hf_weight_name(k): v.detach().cpu() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        weights.pop("lm_head.weight")  # the same tensor as the embedding
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not map onto Llama (missing {missing}, extra {unexpected})")
    return hf


def claim_export_folder(out: Path, overwrite: bool) -> str | None:
    """Check that ``out`` may take an export: a new or empty folder, or with ``overwrite`` one
    whose contents are moved aside (returns where). A training run's folder, a folder in use and
    an earlier export are never written into."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; name a folder to export into")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    holder = holder_if_locked(out)
    if holder:
        raise ConfigError(f"{out} is in use by a run ({holder}); export into another folder")
    what = "a training run" if holds_run(out) else "files"
    if not overwrite:
        raise ConfigError(
            f"{out} already holds {what}; export into a new folder, or pass --overwrite to move "
            "what is there aside (not deleted)"
        )
    return move_aside(out)


def export_model(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    info: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face Llama folder; returns its path. The
    folder must be new or empty (``overwrite`` moves what is there aside)."""
    _require_transformers()  # its missing-dependency message comes before any other complaint
    aside = claim_export_folder(Path(out_dir), overwrite)
    if aside:
        print(f"moved what was in {out_dir} aside to {aside}")
    cfg = model.config
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(
            f"tokenizer vocab_size={tokenizer.vocab_size} differs from the model's "
            f"vocab_size={cfg.vocab_size} (an AR model's vocabulary is the tokenizer's)"
        )
    hf = llama_model(model, tokenizer).eval()
    dtype = next(model.parameters()).dtype
    hf.generation_config.bos_token_id = tokenizer.eos_id
    hf.generation_config.eos_token_id = tokenizer.eos_id
    hf.generation_config.pad_token_id = tokenizer.pad_id

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf.to(dtype).save_pretrained(out)
    tokenizer.save(out / TOKENIZER_DIR)
    hf_tokenizer(tokenizer, out / TOKENIZER_DIR, cfg.max_seq_len).save_pretrained(out)
    record = {"format": "duolm-llama", "tokenizer_kind": tokenizer.kind, **(info or {})}
    (out / EXPORT_INFO).write_text(json.dumps(record, indent=2))
    return out


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Export an AR training checkpoint (or the newest valid one under a run directory)."""

    model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint))
    if state.get("objective") != "ar":
        raise ValueError(
            f"{checkpoint} holds an {state.get('objective')!r} checkpoint; export writes a Hugging "
            "Face LlamaForCausalLM folder, which only an 'ar' (autoregressive) checkpoint is"
        )
    info = {"source_checkpoint": str(checkpoint), "step": state.get("step")}
    return export_model(model, tokenizer, out_dir, info, overwrite)


# ---------------------------------------------------------------- load back


def load_exported(
    folder: str | Path, device: str | torch.device = "cpu"
) -> tuple[Transformer, Tokenizer]:
    """Our ``Transformer`` and ``Tokenizer`` from an exported folder (no transformers needed).

    The shape comes from ``config.json``, so a folder whose weights were changed on the Hugging
    Face side (fine-tuned, say) loads too, as long as it is still a plain Llama."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    cfg = model_config_from_llama(json.loads(config_path.read_text()))
    weights = _read_safetensors(folder)
    state = {our_weight_name(k): v for k, v in weights.items() if "rotary_emb" not in k}
    model = Transformer(cfg)
    dtype = next(iter(state.values())).dtype
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "output.weight")]
    if missing or unexpected:
        raise ValueError(
            f"{folder}: weights do not fit the model (missing {missing}, extra {unexpected})"
        )
    tokenizer_dir = folder / TOKENIZER_DIR
    if not tokenizer_dir.is_dir():
        raise FileNotFoundError(
            f"{folder}: no {TOKENIZER_DIR}/ (folders written by arlm.export carry our tokenizer "
            "there)"
        )
    tokenizer = Tokenizer.load(tokenizer_dir)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    single = folder / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights.update(load_file(str(folder / shard)))
    return weights


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description="Export an AR checkpoint as a Hugging Face LlamaForCausalLM folder."
    )
    parser.add_argument("checkpoint", help="checkpoint directory or run directory")
    parser.add_argument("out", help="folder to write (new or empty)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="export into a folder that holds files, moving them aside first (not deleted)",
    )
    args = parser.parse_args(argv)

    # ImportError: transformers (the "hf" extra) is missing; the message says how to install it
    return report_user_errors(
        lambda: print(
            f"exported to {export_checkpoint(args.checkpoint, args.out, args.overwrite)}"
        ),
        also=(ImportError,),
    )


if __name__ == "__main__":
    sys.exit(main())
