"""Writing token shards (the format is in ``shared.data.shards``): rows cut from a corpus's
token stream as ``tokenize_corpus`` cuts them, written split by split into shard files of a
bounded size, each with its token count and sha256 in the manifest written last."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared import door
from shared.data.rows import PROTOCOLS
from shared.data.shards import FORMAT, MANIFEST, SPLITS, token_dtype
from shared.door import write_atomic
from shared.errors import ConfigError
from shared.tokenizer import Tokenizer

# ---- cutting rows one document at a time ---------------------------------------------------


class RowCutter:
    """Row bodies (rows without their BOS) from documents fed one at a time, equal to the rows
    ``pack_rows`` / ``pad_rows`` cut from the whole list, while holding at most one row of
    carried-over tokens (packed) or one document (padded)."""

    def __init__(self, protocol: str, seq_len: int, eos_id: int, pad_id: int) -> None:
        if protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {protocol!r}")
        self.protocol, self.width = protocol, seq_len - 1
        self.eos_id, self.pad_id = eos_id, pad_id
        self.carry = np.empty(0, dtype=np.int64)

    def add(self, ids: Sequence[int]) -> np.ndarray:
        """The rows this document completes, int64 [k, seq_len - 1] (k may be 0)."""
        doc = np.asarray(ids, dtype=np.int64)
        if self.protocol == "padded":
            body = np.full((1, self.width), self.pad_id, dtype=np.int64)
            kept = doc[: self.width - 1]
            body[0, : len(kept)] = kept
            body[0, len(kept)] = self.eos_id
            return body
        stream = np.concatenate([self.carry, doc, [self.eos_id]])
        n_full = len(stream) // self.width
        self.carry = stream[n_full * self.width :]
        return stream[: n_full * self.width].reshape(n_full, self.width)

    def finish(self, keep_partial: bool) -> np.ndarray:
        """The last, partial packed row (right-padded) when ``keep_partial``; else no row."""
        body = np.full((0, self.width), self.pad_id, dtype=np.int64)
        if keep_partial and len(self.carry):
            body = np.full((1, self.width), self.pad_id, dtype=np.int64)
            body[0, : len(self.carry)] = self.carry
        self.carry = np.empty(0, dtype=np.int64)
        return body


# ---- writing ------------------------------------------------------------------------------------


class SplitWriter:
    """Writes one split's row bodies into shards of at most ``shard_rows`` rows each, holding
    only the shard being filled (in its on-disk dtype)."""

    def __init__(
        self, folder: Path, split: str, dtype: np.dtype, shard_rows: int, tokenizer: Tokenizer
    ) -> None:
        self.folder, self.split = folder, split
        self.pad_id = tokenizer.pad_id
        self.token_bytes = tokenizer.token_bytes()
        self.buffer = np.empty((shard_rows, 0), dtype=dtype)
        self.shard_rows, self.filled = shard_rows, 0
        self.shards: list[dict[str, Any]] = []
        self.n_bytes = self.n_loss_tokens = 0

    def add(self, bodies: np.ndarray) -> None:
        if self.buffer.shape[1] != bodies.shape[1]:
            self.buffer = np.empty((self.shard_rows, bodies.shape[1]), dtype=self.buffer.dtype)
        while len(bodies):
            take = min(len(bodies), self.shard_rows - self.filled)
            self.buffer[self.filled : self.filled + take] = bodies[:take]
            self.filled += take
            bodies = bodies[take:]
            if self.filled == self.shard_rows:
                self.flush()

    def flush(self) -> None:
        if not self.filled:
            return
        rows = self.buffer[: self.filled]
        counts = np.bincount(rows.ravel(), minlength=len(self.token_bytes))
        self.n_bytes += int(counts[: len(self.token_bytes)] @ self.token_bytes)  # specials: 0
        self.n_loss_tokens += int(rows.size - counts[self.pad_id])
        data = rows.tobytes()
        name = f"{self.split}-{len(self.shards):05d}.bin"
        write_atomic(self.folder / name, data)
        self.shards.append({"file": name, "tokens": int(rows.size), "sha256": sha256_bytes(data)})
        self.filled = 0

    def record(self, width: int) -> dict[str, Any]:
        self.flush()
        return {
            "shards": self.shards,
            "n_rows": sum(s["tokens"] for s in self.shards) // width,
            "n_bytes": self.n_bytes,
            "n_loss_tokens": self.n_loss_tokens,
        }


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_shards(
    folder: Path,
    documents: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    *,
    protocol: str,
    seq_len: int,
    shard_tokens: int,
    source: str,
    encode_batch: int = 64,
) -> dict[str, Any]:
    """Tokenize ``documents`` ((split, text) pairs, split "train" or "validation", read once, so
    a stream works) into shards under ``folder``; returns the manifest, written last so that its
    presence means every shard beside it is complete."""
    if seq_len < 4:
        raise ConfigError(f"seq_len={seq_len} must be >= 4")
    width = seq_len - 1
    if shard_tokens < width:
        raise ConfigError(
            f"shard_tokens={shard_tokens} is less than one row ({width} tokens at seq_len="
            f"{seq_len}); give at least {width}"
        )
    if (folder / MANIFEST).exists():
        raise ConfigError(f"{folder} already holds shards ({MANIFEST}); choose a new --out folder")
    door.declare_root(folder)  # every path below the shard folder is walked from it
    door.make_folders(folder)
    dtype = token_dtype(tokenizer.vocab_size)
    writers = {
        split: SplitWriter(folder, split, dtype, shard_tokens // width, tokenizer)
        for split in SPLITS
    }
    cutters = {
        split: RowCutter(protocol, seq_len, tokenizer.eos_id, tokenizer.pad_id) for split in SPLITS
    }
    kept = ((split, text) for split, text in documents if text and text.strip())
    for batch in batched(kept, encode_batch):
        for (split, _), ids in zip(batch, tokenizer.encode_batch([t for _, t in batch])):
            writers[split].add(cutters[split].add(ids))
    for split in SPLITS:
        # as in memory: train drops its last partial row, validation keeps it padded
        writers[split].add(cutters[split].finish(keep_partial=split == "validation"))
    splits = {split: writers[split].record(width) for split in SPLITS}
    if splits["train"]["n_rows"] == 0:
        raise ConfigError(
            f"corpus {source!r} is too small for seq_len={seq_len}: its train split yields no "
            f"full row of {width} tokens"
        )
    tokenizer.save(folder / "tokenizer")
    manifest = {
        "format": FORMAT,
        "source": source,
        "dtype": dtype.str,
        "protocol": protocol,
        "seq_len": seq_len,
        "row_tokens": width,
        "tokenizer": tokenizer_record(tokenizer),
        "splits": splits,
    }
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


def tokenizer_record(tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "kind": tokenizer.kind,
        "fingerprint": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
    }


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
