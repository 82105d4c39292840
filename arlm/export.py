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

from shared import door, door_staging
from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import export_parser
from shared.config import ModelConfig
from shared.door import read_json_file, write_atomic
from shared.errors import ConfigError, report_user_errors
from shared.formats.exported import EXPORT_INFO, export_record, export_refusal
from shared.formats.hf_tokenizer import hf_tokenizer, require_transformers
from shared.formats.llama import hf_weight_name, model_config_from_hf, our_weight_name
from shared.formats.llama import llama_config_fields as llama_fields
from shared.formats.reader import check_folder_files, open_safetensors, shard_files
from shared.model import Transformer
from shared.tokenizer import Tokenizer
from shared.training.run_folder import claim_output_folder, mark_folder
from shared.training.unfinished import removed_if_unfinished

TOKENIZER_DIR = "duolm_tokenizer"


def llama_config_fields(cfg: ModelConfig, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments describing our backbone and its special ids."""
    fields = llama_fields(cfg)
    if tokenizer is not None:
        fields.update(
            bos_token_id=tokenizer.eos_id,
            eos_token_id=tokenizer.eos_id,
            pad_token_id=tokenizer.pad_id,
        )
    return fields


# ---------------------------------------------------------------- export


def llama_model(model: Transformer, tokenizer: Tokenizer | None = None, **config: Any):
    """A ``LlamaForCausalLM`` of ``model``'s shape holding a copy of its weights (on the CPU).
    ``config``: further ``LlamaConfig`` settings (``attn_implementation``, ``use_cache``)."""
    transformers = require_transformers()
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


def export_model(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    info: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face Llama folder; returns its path. The
    folder must be new or empty (``overwrite`` moves what is there aside)."""
    require_transformers()  # its missing-dependency message comes before any other complaint
    sources = [Path(info["source_checkpoint"])] if info and "source_checkpoint" in info else []
    aside = claim_output_folder(Path(out_dir), overwrite, "export", sources)
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
    # The record that makes the folder an export is written last, whole; a write that fails (a
    # full disk) removes what the export had written, and the folders it made.
    door.declare_root(out)  # every path below the export is walked from it
    with removed_if_unfinished(out):
        door.make_folders(out)
        tokenizer.save(out / TOKENIZER_DIR)
        # transformers writes by name: into a private folder, whose files the door brings over
        with door_staging.library_folder() as staging:
            hf.to(dtype).save_pretrained(staging)
            hf_tokenizer(tokenizer, out / TOKENIZER_DIR, cfg.max_seq_len).save_pretrained(staging)
            door_staging.copy_folder_into(staging, out)
        record = {"format": "duolm-llama", "tokenizer_kind": tokenizer.kind, **(info or {})}
        write_atomic(out / EXPORT_INFO, json.dumps(record, indent=2))
        mark_folder(out, "export")
        door.follow_umask(out)  # save_pretrained writes its weights 0600; the rest is 0644
    return out


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Export an AR training checkpoint (or the newest valid one under a run directory)."""

    model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint))
    if state.get("objective") != "ar":
        raise ConfigError(export_refusal(checkpoint, state.get("objective"), "ar"))
    return export_model(model, tokenizer, out_dir, export_record(checkpoint, state), overwrite)


# ---------------------------------------------------------------- load back


def load_exported(
    folder: str | Path, device: str | torch.device = "cpu"
) -> tuple[Transformer, Tokenizer]:
    """Our ``Transformer`` and ``Tokenizer`` from an exported folder (no transformers needed).

    The shape comes from ``config.json``, so a folder whose weights were changed on the Hugging
    Face side (fine-tuned, say) loads too, as long as it is still a plain Llama."""
    folder = Path(folder)
    check_folder_files(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    config = read_json_file(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: holds a JSON {type(config).__name__}, not an object")
    if config.get("model_type") != "llama":
        raise ValueError(f"model_type={config.get('model_type')!r}: only 'llama' folders load")
    cfg = model_config_from_hf(config)
    shapes, _, read = open_safetensors(shard_files(folder))
    # built on the meta device and compared with the stored shapes before it takes memory: a
    # config.json may ask for far more than its weights hold
    with torch.device("meta"):
        model = Transformer(cfg)
    own = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    stored = {our_weight_name(k): shape for k, shape in shapes.items() if "rotary_emb" not in k}
    wrong = next((n for n in sorted(stored) if n in own and stored[n] != own[n]), None)
    if wrong is not None:
        raise ValueError(
            f"{folder}: {wrong} is stored with shape {list(stored[wrong])}, but config.json "
            f"makes it {list(own[wrong])}"
        )
    model.materialise("cpu")
    weights = {name: read(name) for name in shapes}
    state = {our_weight_name(k): v for k, v in weights.items() if "rotary_emb" not in k}
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


# ---------------------------------------------------------------- command line


def build_parser():
    return export_parser(
        "Export a checkpoint: AR as a Hugging Face LlamaForCausalLM folder (an MDM checkpoint "
        "exports as a LLaDA folder through duolm export or python -m dllm.export)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
