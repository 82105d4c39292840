"""Token shards: a corpus tokenized once into flat binary files that training reads through
``np.memmap``, so a corpus larger than memory trains without ever being loaded whole.

A shard folder holds ``manifest.json``, ``tokenizer/`` and one ``<split>-NNNNN.bin`` per shard:
the row bodies of that split back to back, as little-endian uint16 (vocabularies up to 65,536
ids) or uint32. A row body is a training row without its first position, which is always
``eos_id`` (the BOS of the row contract in ``shared.data.rows``), so a shard of a packed split is
exactly the packed token stream ``doc EOS doc EOS ...`` and row ``i`` is ``[EOS] +
body[i]``: the same rows ``tokenize_corpus`` cuts in memory. Shards end on row boundaries, so no
row spans two files. The manifest names the dtype, the tokenizer (kind and fingerprint), the row
length, and each shard's token count and sha256; opening a folder checks all of them and refuses
a missing, truncated or altered shard in one line.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared import door
from shared.data.rows import PROTOCOLS
from shared.errors import ConfigError
from shared.path_checks import not_a_regular_file, refuse_links_within
from shared.tokenizer import Tokenizer

SHARDS_PREFIX = "shards:"
MANIFEST = "manifest.json"
FORMAT = 1
SPLITS = ("train", "validation")
_HASH_CHUNK = 1 << 20  # bytes per read while hashing: bounded memory for any shard size


def shard_folder(dataset: str) -> Path | None:
    """The folder of a ``shards:DIR`` data spec, or None for any other spec."""
    if not dataset.startswith(SHARDS_PREFIX):
        return None
    folder = dataset[len(SHARDS_PREFIX) :].strip()
    if not folder:
        raise ConfigError("dataset='shards:' names no folder; write shards:DIR")
    return Path(folder).expanduser()


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of the vocabulary."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


# ---- reading ------------------------------------------------------------------------------------


_SHARD_NAME = re.compile(r"(train|validation)-[0-9]{5,}\.bin")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MANIFEST_LIMIT = 64 << 20  # bytes: a manifest of a million shards fits in a tenth of it


def _count(value: Any, what: str, *, at_least: int = 0, below: int | None = None) -> int:
    """``value`` when it is an integer (not a bool, a float or a string) in range; else a
    ValueError naming ``what``."""
    if type(value) is not int or value < at_least or (below is not None and value >= below):
        bound = f" and below {below:,}" if below is not None else ""
        raise ValueError(f"{what} is {str(value)[:40]!r}, not an integer >= {at_least}{bound}")
    return value


def check_manifest(manifest: Any) -> None:
    """Every field training reads, with its exact type and range; a ValueError names the first
    that is not (a crafted manifest: a string token count, 1e30 rows, a shard named
    ``../x``, an id beyond its vocabulary)."""
    if not isinstance(manifest, dict):
        raise ValueError("not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"shard format {manifest.get('format')!r}; this version reads {FORMAT}")
    if manifest.get("dtype") not in ("<u2", "<u4"):
        raise ValueError(f"dtype {manifest.get('dtype')!r} is not <u2 or <u4")
    if manifest.get("protocol") not in PROTOCOLS or not isinstance(manifest.get("source"), str):
        raise ValueError(f"protocol {manifest.get('protocol')!r} or source is not valid")
    seq_len = _count(manifest.get("seq_len"), "seq_len", at_least=4, below=1 << 24)
    if manifest.get("row_tokens") != seq_len - 1:
        raise ValueError(f"row_tokens {manifest.get('row_tokens')!r} is not seq_len - 1")
    tokenizer = manifest.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("fingerprint"), str):
        raise ValueError("tokenizer is not a record with a fingerprint")
    vocab = _count(tokenizer.get("vocab_size"), "tokenizer.vocab_size", at_least=1, below=1 << 32)
    for field in ("eos_id", "pad_id"):
        _count(tokenizer.get(field), f"tokenizer.{field}", below=vocab)
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        raise ValueError("splits is not a record")
    for split in SPLITS:
        record = splits.get(split)
        if not isinstance(record, dict) or not isinstance(record.get("shards"), list):
            raise ValueError(f"splits.{split} lists no shards")
        tokens = 0
        for shard in record["shards"]:
            if not isinstance(shard, dict) or not isinstance(shard.get("file"), str):
                raise ValueError(f"a {split} shard has no file name")
            if not _SHARD_NAME.fullmatch(shard["file"]) or not shard["file"].startswith(split):
                raise ValueError(f"shard name {shard['file'][:60]!r} is not a plain shard name")
            count = _count(shard.get("tokens"), f"{shard['file']} tokens", below=1 << 48)
            if count % (seq_len - 1):
                raise ValueError(f"{shard['file']} holds {count} tokens, not whole rows")
            if not isinstance(shard.get("sha256"), str) or not _SHA256.fullmatch(shard["sha256"]):
                raise ValueError(f"{shard['file']} sha256 is not 64 hex digits")
            tokens += count
        if _count(record.get("n_rows"), f"splits.{split}.n_rows") != tokens // (seq_len - 1):
            raise ValueError(f"splits.{split}.n_rows does not match its shards' tokens")
        for field in ("n_bytes", "n_loss_tokens"):
            _count(record.get(field), f"splits.{split}.{field}")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a shard folder, read through the door (no link in the folder, no FIFO)
    and every field checked (``check_manifest``); one-line refusals otherwise."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ConfigError(f"shards:{folder}: no such folder")
    refuse_links_within(folder, "a shard folder")
    if not path.is_file():
        raise ConfigError(
            f"shards:{folder}: no {MANIFEST} (not a folder written by duolm shard-data, or its "
            "writing did not finish)"
        )
    manifest = door.read_json_object(path, root=folder, limit=MANIFEST_LIMIT)
    try:
        check_manifest(manifest)
    except ValueError as error:
        raise ConfigError(f"{path} is not a valid shard manifest: {error}") from None
    return manifest


def file_sha256(path: Path, root: Path | None = None) -> str:
    digest = hashlib.sha256()
    with door.open_read(path, root) as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def scan_shard(path: Path, folder: Path, dtype: np.dtype) -> tuple[str, int]:
    """(sha256, the largest token id) of a shard, read once in bounded chunks."""
    digest, largest = hashlib.sha256(), -1
    with door.open_read(path, folder, what="a shard folder") as handle:
        while chunk := handle.read(_HASH_CHUNK - _HASH_CHUNK % dtype.itemsize):
            digest.update(chunk)
            ids = np.frombuffer(chunk[: len(chunk) - len(chunk) % dtype.itemsize], dtype=dtype)
            largest = max(largest, int(ids.max())) if ids.size else largest
    return digest.hexdigest(), largest


def check_shard(
    folder: Path, shard: dict[str, Any], dtype: np.dtype, verify: bool, vocab_size: int
) -> Path:
    """The shard's path once its file is a regular file of the manifest's size and (``verify``)
    has its hash and no token id beyond the vocabulary, so training never meets one mid-run."""
    path = folder / shard["file"]
    if not os.path.lexists(path):
        raise ConfigError(f"shard {path} is missing (listed in {folder / MANIFEST})")
    kind = not_a_regular_file(path)
    if kind:
        raise ConfigError(f"shard {path} is {kind}, not a regular file")
    expected = shard["tokens"] * dtype.itemsize
    size = os.lstat(path).st_size
    if size != expected:
        raise ConfigError(
            f"shard {path} is truncated or altered: {size} bytes, the manifest says {expected}"
        )
    if not verify:
        return path
    digest, largest = scan_shard(path, folder, dtype)
    if digest != shard["sha256"]:
        raise ConfigError(
            f"shard {path} fails its checksum (sha256 differs from {folder / MANIFEST}): "
            "the file changed after it was written; write the shards again"
        )
    if largest >= vocab_size:
        raise ConfigError(
            f"shard {path} holds token id {largest}, beyond the vocabulary of {vocab_size} ids: "
            "written with another tokenizer; write the shards again"
        )
    return path


def rank_shards(shards: list[dict[str, Any]], rank: int, world: int, folder: Path) -> list[dict]:
    """The shards process ``rank`` of ``world`` reads: every world-th one, starting at its rank.
    Refused unless the count divides evenly, so that every process holds its own part."""
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is not a process of a world of {world}")
    if len(shards) % world:
        raise ConfigError(
            f"shards:{folder} has {len(shards)} train shard(s), which {world} processes cannot "
            f"split evenly; run on a process count that divides {len(shards)}, or write the "
            "shards again with a --shard-tokens giving a multiple of it"
        )
    return shards[rank::world]


class ShardRows:
    """Training rows read from memory-mapped shards on demand: ``rows[indices]`` (an int array or
    a slice) is an int32 array [k, seq_len] of the rows asked for; nothing else is loaded."""

    def __init__(self, paths: list[Path], dtype: np.dtype, seq_len: int, eos_id: int) -> None:
        self.seq_len, self.width, self.eos_id = seq_len, seq_len - 1, eos_id
        self.maps = [door.memmap(p, dtype).reshape(-1, self.width) for p in paths]
        self.starts = np.cumsum([0] + [len(m) for m in self.maps])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), self.seq_len)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        index = np.asarray(index, dtype=np.int64)
        if index.ndim != 1:
            raise TypeError("ShardRows takes a 1-d array of row indices or a slice")
        if len(index) and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        out = np.empty((len(index), self.seq_len), dtype=np.int32)
        out[:, 0] = self.eos_id
        shard = np.searchsorted(self.starts, index, side="right") - 1
        for s in np.unique(shard):
            picked = shard == s
            out[picked, 1:] = self.maps[s][index[picked] - self.starts[s]]
        return out


@dataclass
class ShardSplits:
    """What training reads from a shard folder: this process's train rows (memory-mapped) and
    the validation rows."""

    manifest: dict[str, Any]
    manifest_sha256: str
    train: ShardRows
    total_train_rows: int
    validation: ShardRows


def open_shards(
    folder: Path,
    tokenizer: Tokenizer,
    *,
    protocol: str,
    seq_len: int,
    rank: int = 0,
    world: int = 1,
    verify: bool = True,
) -> ShardSplits:
    """Open a shard folder for training with ``tokenizer`` at ``protocol`` and ``seq_len``: the
    manifest must agree with all three, and every shard this process reads (its own train
    shards and all validation shards) must be whole and, with ``verify``, match its sha256."""
    manifest = read_manifest(folder)
    saved_tok = manifest["tokenizer"]
    if saved_tok["fingerprint"] != tokenizer.fingerprint():
        raise ConfigError(
            f"shards:{folder} were written with another tokenizer ({saved_tok.get('kind')}, "
            f"fingerprint {saved_tok['fingerprint']}) than this run's ({tokenizer.kind}, "
            f"{tokenizer.fingerprint()}); write the shards with this tokenizer or train with theirs"
        )
    for field, wanted in (("protocol", protocol), ("seq_len", seq_len)):
        if manifest[field] != wanted:
            raise ConfigError(
                f"shards:{folder} hold {field}={manifest[field]!r} rows; this run asks for "
                f"{field}={wanted!r} (set --{field.replace('_', '-')} {manifest[field]} or write "
                "the shards again)"
            )
    dtype = np.dtype(manifest["dtype"])
    if dtype != token_dtype(tokenizer.vocab_size):
        raise ConfigError(f"{folder / MANIFEST}: dtype {dtype} does not fit this vocabulary")
    train_shards = rank_shards(manifest["splits"]["train"]["shards"], rank, world, folder)

    def rows_of(shards: list[dict[str, Any]]) -> ShardRows:
        paths = [check_shard(folder, s, dtype, verify, tokenizer.vocab_size) for s in shards]
        return ShardRows(paths, dtype, seq_len, tokenizer.eos_id)

    total = sum(s["tokens"] for s in manifest["splits"]["train"]["shards"]) // (seq_len - 1)
    return ShardSplits(
        manifest,
        file_sha256(folder / MANIFEST, folder),
        rows_of(train_shards),
        total,
        rows_of(manifest["splits"]["validation"]["shards"]),
    )


def shard_protocol_record(splits: ShardSplits, folder: Path) -> dict[str, Any]:
    """The data record of a run on shards, in the shape ``shared.data.rows.protocol_record``
    gives in-memory runs; the corpus fingerprint is the manifest's hash."""
    manifest = splits.manifest
    tokenizer = dict(manifest["tokenizer"])
    return {
        "dataset": f"{SHARDS_PREFIX}{folder}",
        "source": manifest["source"],
        "corpus_fingerprint": splits.manifest_sha256[:24],
        "tokenizer": tokenizer,
        "protocol": manifest["protocol"],
        "seq_len": manifest["seq_len"],
        "convention": (
            "row[0] = eos_id (BOS); documents end with eos_id; "
            "loss at positions >= 1 whose id != pad_id"
        ),
        "splits": {
            name: {
                key: manifest["splits"][name][key] for key in ("n_rows", "n_bytes", "n_loss_tokens")
            }
            | {"n_shards": len(manifest["splits"][name]["shards"])}
            for name in SPLITS
        },
    }
