"""Export a masked-diffusion checkpoint as a LLaDA folder, so LLaDA-ecosystem tools load it.

    duolm export runs/demo/mdm exported-llada/        # an mdm checkpoint exports as LLaDA

The folder holds ``config.json`` (``LLaDAModelLM``'s fields, ``mask_token_id`` = our last row,
so no row moves), ``model.safetensors`` under LLaDA's weight names, the tokenizer as a Hugging
Face fast tokenizer (``tokenizer.json``, ``tokenizer_config.json``), and ``duolm_export.json``.
LLaDA's modeling code is loaded with ``trust_remote_code``; the config's ``auto_map`` names
LLaDA's files (``configuration_llada.py``, ``modeling_llada.py``), which are not shipped here:
copy them from LLaDA's repository into the folder. ``duolm import`` reads the folder back without
them, and ``import(export(model))`` gives identical logits (tested).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dllm.canvas import mask_token_id
from shared import door, door_staging
from shared.checkpoint import full_model_state, load_model_from_checkpoint
from shared.cli_args import export_parser
from shared.door import write_atomic
from shared.errors import ConfigError, report_user_errors
from shared.formats.diffusion import llada_config_fields, llada_weight_name
from shared.formats.exported import EXPORT_INFO, export_record, export_refusal
from shared.formats.hf_tokenizer import hf_tokenizer, require_transformers
from shared.model import Transformer
from shared.tensor_files import save_tensors
from shared.tokenizer import Tokenizer
from shared.training.run_folder import claim_output_folder, mark_folder
from shared.training.unfinished import removed_if_unfinished

TOKENIZER_DIR = "duolm_tokenizer"
LLADA_AUTO_MAP = {
    "AutoConfig": "configuration_llada.LLaDAConfig",
    "AutoModel": "modeling_llada.LLaDAModelLM",
    "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
}


def export_llada_model(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    info: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an MDM ``model`` and its ``tokenizer`` as a LLaDA folder; returns its path. The
    folder must be new or empty (``overwrite`` moves what is there aside)."""
    require_transformers()  # its missing-dependency message comes before any other complaint
    out = Path(out_dir)
    mask = mask_token_id(model, tokenizer)
    cfg = model.config
    config = llada_config_fields(cfg, mask, tokenizer.eos_id, tokenizer.pad_id)
    sources = [Path(info["source_checkpoint"])] if info and "source_checkpoint" in info else []
    aside = claim_output_folder(out, overwrite, "export", sources)
    if aside:
        print(f"moved what was in {out} aside to {aside}")
    weights = {llada_weight_name(name): t for name, t in full_model_state(model).items()}
    if cfg.tie_embeddings:  # LLaDA's tied head is its embedding, stored once as wte
        weights = {
            ("model.transformer.wte.weight" if n == "model.transformer.ff_out.weight" else n): t
            for n, t in weights.items()
        }
    config["auto_map"] = LLADA_AUTO_MAP
    # The record that makes the folder an export is written last, whole; a write that fails (a
    # full disk) removes what the export had written, and the folders it made.
    door.declare_root(out)  # every path below the export is walked from it
    with removed_if_unfinished(out):
        door.make_folders(out)
        save_tensors(weights, out / "model.safetensors")
        write_atomic(out / "config.json", json.dumps(config, indent=2))
        tokenizer.save(out / TOKENIZER_DIR)
        # transformers writes by name: into a private folder, whose files the door brings over
        with door_staging.library_folder() as staging:
            hf_tokenizer(tokenizer, out / TOKENIZER_DIR, cfg.max_seq_len).save_pretrained(staging)
            door_staging.copy_folder_into(staging, out)
        record = {"format": "duolm-llada", "tokenizer_kind": tokenizer.kind, **(info or {})}
        write_atomic(out / EXPORT_INFO, json.dumps(record, indent=2))
        mark_folder(out, "export")
        door.follow_umask(out)  # save_file and save_pretrained write some files 0600
    return out


def export_llada_checkpoint(
    checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False
) -> Path:
    """Export an MDM training checkpoint (or the newest valid one under a run directory)."""
    model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint))
    if state.get("objective") != "mdm":
        raise ConfigError(export_refusal(checkpoint, state.get("objective"), "mdm"))
    info = export_record(checkpoint, state)
    return export_llada_model(model, tokenizer, out_dir, info, overwrite)


def main(argv: list[str] | None = None) -> int:
    parser = export_parser("Export an MDM checkpoint as a LLaDA folder.")
    args = parser.parse_args(argv)
    return report_user_errors(
        lambda: print(
            f"exported to {export_llada_checkpoint(args.checkpoint, args.out, args.overwrite)}"
        ),
        also=(ImportError,),
    )


if __name__ == "__main__":
    sys.exit(main())
