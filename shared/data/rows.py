"""The token-row format both objectives train on, the tokenized-data cache, and a resumable
sampler.

Row contract: every row is ``seq_len`` ids, position 0 is always ``eos_id`` (acting as BOS), and
loss is taken at every position >= 1 whose id is not ``pad_id``.

* "packed": ``doc1 EOS doc2 EOS ...`` cut into chunks of ``seq_len - 1``; row = [EOS] + chunk.
  Train drops the final partial chunk; validation keeps it right-padded so every byte is scored.
* "padded": one document per row: [EOS] + doc[: seq_len - 2] + [EOS] + PAD...
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared import door
from shared.data.corpus import CorpusSplits
from shared.door import write_atomic
from shared.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PROTOCOLS = ("packed", "padded")
_CACHE_FORMAT = 1
_ENCODE_BATCH = 1024

# ---- tokenized rows -----------------------------------------------------------------------------


@dataclass
class TokenizedSplit:
    tokens: np.ndarray  # int32 [n_rows, seq_len]
    n_bytes: int  # UTF-8 bytes of all loss positions, via token_bytes
    n_loss_tokens: int
    protocol: str
    seq_len: int

    @property
    def n_rows(self) -> int:
        return int(self.tokens.shape[0])


def _validate_layout(protocol: str, seq_len: int) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {protocol!r}")
    if int(seq_len) != seq_len or seq_len < 4:
        raise ValueError(f"seq_len must be an integer >= 4; got {seq_len!r}")


def _encode_docs(docs: Sequence[str], tokenizer: Tokenizer) -> list[np.ndarray]:
    docs = [d for d in docs if d.strip()]
    out: list[np.ndarray] = []
    # batches bound the memory held as Python int lists
    for start in range(0, len(docs), _ENCODE_BATCH):
        batch = tokenizer.encode_batch(docs[start : start + _ENCODE_BATCH])
        out.extend(np.asarray(ids, dtype=np.int32) for ids in batch)
    return out


def pack_rows(
    docs: Sequence[np.ndarray], *, seq_len: int, eos_id: int, pad_id: int, keep_partial: bool
) -> np.ndarray:
    """Packed rows: [eos] + consecutive (seq_len - 1)-token chunks of doc EOS doc EOS ..."""
    total = sum(len(d) + 1 for d in docs)
    stream = np.empty(total, dtype=np.int32)
    pos = 0
    for d in docs:
        stream[pos : pos + len(d)] = d
        stream[pos + len(d)] = eos_id
        pos += len(d) + 1
    chunk = seq_len - 1
    n_full, rest = divmod(total, chunk)
    n_rows = n_full + (1 if keep_partial and rest else 0)
    rows = np.full((n_rows, seq_len), pad_id, dtype=np.int32)
    rows[:, 0] = eos_id
    rows[:n_full, 1:] = stream[: n_full * chunk].reshape(n_full, chunk)
    if n_rows > n_full:
        rows[n_full, 1 : 1 + rest] = stream[n_full * chunk :]
    return rows


def pad_rows(docs: Sequence[np.ndarray], *, seq_len: int, eos_id: int, pad_id: int) -> np.ndarray:
    """One row per document: [eos] + doc[: seq_len - 2] + [eos] + pad..."""
    rows = np.full((len(docs), seq_len), pad_id, dtype=np.int32)
    rows[:, 0] = eos_id
    for i, d in enumerate(docs):
        d = d[: seq_len - 2]
        rows[i, 1 : 1 + len(d)] = d
        rows[i, 1 + len(d)] = eos_id
    return rows


def _make_split(
    docs: Sequence[str], tokenizer: Tokenizer, protocol: str, seq_len: int, keep_partial: bool
) -> TokenizedSplit:
    encoded = _encode_docs(docs, tokenizer)
    ids = {"seq_len": seq_len, "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id}
    if protocol == "packed":
        tokens = pack_rows(encoded, keep_partial=keep_partial, **ids)
    else:
        tokens = pad_rows(encoded, **ids)
    return _summarize(tokens, tokenizer, protocol, seq_len)


def _summarize(
    tokens: np.ndarray, tokenizer: Tokenizer, protocol: str, seq_len: int
) -> TokenizedSplit:
    targets = tokens[:, 1:]
    # specials weigh 0 bytes, so eos/pad add nothing to n_bytes
    n_bytes = int(tokenizer.token_bytes()[targets].sum())
    n_loss = int((targets != tokenizer.pad_id).sum())
    return TokenizedSplit(tokens, n_bytes, n_loss, protocol, seq_len)


def _cache_key(corpus: CorpusSplits, tokenizer: Tokenizer, protocol: str, seq_len: int) -> str:
    payload = {
        "format": _CACHE_FORMAT,
        "corpus": corpus.fingerprint,
        "tokenizer": tokenizer.fingerprint(),
        "protocol": protocol,
        "seq_len": int(seq_len),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def _save_cache(folder: Path, splits: Mapping[str, TokenizedSplit], key_info: dict) -> None:
    door.make_folders(folder)
    meta: dict[str, Any] = {**key_info, "splits": {}}
    for name, split in splits.items():
        write_atomic(folder / f"{name}.npy", lambda fh, a=split.tokens: np.save(fh, a))
        meta["splits"][name] = {
            "shape": list(split.tokens.shape),
            "n_bytes": split.n_bytes,
            "n_loss_tokens": split.n_loss_tokens,
        }
    # meta last: its presence means the arrays beside it are complete
    data = json.dumps(meta, indent=2).encode("utf-8")
    write_atomic(folder / "meta.json", data)


def _load_cache(folder: Path, protocol: str, seq_len: int) -> dict[str, TokenizedSplit] | None:
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = door.read_json_object(meta_path, root=folder)
        out = {}
        for name in ("train", "validation"):
            info = meta["splits"][name]
            with door.open_read(folder / f"{name}.npy", folder) as handle:
                tokens = np.load(handle, allow_pickle=False)  # data, never objects
            if list(tokens.shape) != info["shape"] or tokens.dtype != np.int32:
                raise ValueError(f"{name}.npy does not match meta.json")
            out[name] = TokenizedSplit(
                tokens, int(info["n_bytes"]), int(info["n_loss_tokens"]), protocol, seq_len
            )
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        log.warning("ignoring unreadable tokenized cache %s: %s", folder, exc)
        return None
    return out


def tokenize_corpus(
    corpus: CorpusSplits,
    tokenizer: Tokenizer,
    *,
    protocol: str,
    seq_len: int,
    cache_dir: Path,
) -> dict[str, TokenizedSplit]:
    """Rows for "train" and "validation", cached under cache_dir/tokenized/<key>."""
    _validate_layout(protocol, seq_len)
    seq_len = int(seq_len)
    key = _cache_key(corpus, tokenizer, protocol, seq_len)
    folder = Path(cache_dir) / "tokenized" / key
    cached = _load_cache(folder, protocol, seq_len)
    if cached is not None:
        log.info("loaded tokenized %s rows from %s", corpus.name, folder)
        return cached

    train = _make_split(corpus.train, tokenizer, protocol, seq_len, keep_partial=False)
    if train.n_rows == 0:
        raise ValueError(
            f"corpus {corpus.name!r} is too small for seq_len={seq_len}: the train split yields "
            f"no full row of {seq_len - 1} tokens; use a smaller seq_len or a larger corpus"
        )
    validation = _make_split(corpus.validation, tokenizer, protocol, seq_len, keep_partial=True)
    splits = {"train": train, "validation": validation}
    key_info = {
        "format": _CACHE_FORMAT,
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "protocol": protocol,
        "seq_len": seq_len,
    }
    _save_cache(folder, splits, key_info)
    log.info("tokenized %s into %s", corpus.name, folder)
    return splits


def protocol_record(
    corpus: CorpusSplits,
    tokenizer: Tokenizer,
    splits: Mapping[str, TokenizedSplit],
    *,
    protocol: str | None = None,
    seq_len: int | None = None,
) -> dict[str, Any]:
    """JSON-able description of the data protocol, for checkpoints and reports.

    ``protocol`` and ``seq_len`` default to the splits' own; when given they must agree.
    """
    first = next(iter(splits.values()))
    for field, given, actual in (
        ("protocol", protocol, first.protocol),
        ("seq_len", seq_len, first.seq_len),
    ):
        if given is not None and given != actual:
            raise ValueError(f"{field}={given!r} does not match the tokenized splits ({actual!r})")
    return {
        "dataset": corpus.name,
        "corpus_fingerprint": corpus.fingerprint,
        "tokenizer": {
            "kind": tokenizer.kind,
            "fingerprint": tokenizer.fingerprint(),
            "vocab_size": tokenizer.vocab_size,
            "eos_id": tokenizer.eos_id,
            "pad_id": tokenizer.pad_id,
            # False: the tokenizer normalizes text, so bits/byte is an estimate (Tokenizer docs)
            "bytes_exact": tokenizer.bytes_exact,
        },
        "protocol": first.protocol,
        "seq_len": first.seq_len,
        "convention": (
            "row[0] = eos_id (BOS); documents end with eos_id; "
            "loss at positions >= 1 whose id != pad_id"
        ),
        "splits": {
            name: {
                "n_documents": len(getattr(corpus, name, [])),
                "n_rows": split.n_rows,
                "n_bytes": split.n_bytes,
                "n_loss_tokens": split.n_loss_tokens,
            }
            for name, split in splits.items()
        },
    }


# ---- sampling -----------------------------------------------------------------------------------


class EpochSampler:
    """Row order as a pure function of (seed, global sample position), for exact resume.

    Position p belongs to epoch e = p // n_rows and reads row perm_e[p % n_rows], where perm_e
    is drawn from ``np.random.default_rng([seed, e])`` (``[seed, e, *salt]`` with a salt: one
    process's own order over its own shards).
    """

    def __init__(self, n_rows: int, seed: int, salt: tuple[int, ...] = ()) -> None:
        if n_rows <= 0:
            raise ValueError(f"n_rows must be positive; got {n_rows}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative; got {seed}")
        self.n_rows = int(n_rows)
        self.seed = int(seed)
        self.salt = tuple(int(word) for word in salt)
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch, *self.salt]).permutation(self.n_rows)
            if len(self._perms) >= 2:  # a batch spans at most a couple of epochs
                self._perms.pop(next(iter(self._perms)))
            self._perms[epoch] = perm
        return perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """int64 row indices for sample positions start .. start + count - 1."""
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be non-negative; got {start}, {count}")
        positions = np.arange(start, start + count, dtype=np.int64)
        out = np.empty(count, dtype=np.int64)
        epochs = positions // self.n_rows
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self.permutation(int(epoch))[positions[mask] % self.n_rows]
        return out
