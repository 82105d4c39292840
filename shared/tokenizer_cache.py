"""A tokenizer by its kind's name (``byte``, ``gpt2``, ``bpe``, ``hf:...``); a BPE trained on a
corpus is cached under the corpus's fingerprint and vocabulary size, so it is trained once."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from shared import door
from shared.tokenizer import (
    HF_KIND_HINT,
    KINDS,
    META_FILE,
    Tokenizer,
    check_bpe_vocab_size,
    is_hf_kind,
)


def texts_fingerprint(texts: Iterable[str]) -> str:
    """sha256 hex of a sequence of texts (length-prefixed so boundaries matter)."""
    h = hashlib.sha256()
    for t in texts:
        data = t.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def build_tokenizer(
    kind: str,
    *,
    vocab_size: int | None = None,
    train_texts: Sequence[str] | None = None,
    corpus_fingerprint: str | None = None,
    cache_dir: Path,
) -> Tokenizer:
    """Build the tokenizer named by kind.

    ``vocab_size`` and ``train_texts`` only matter for "bpe", whose training result is cached
    under ``cache_dir/tokenizers/bpe-<corpus fingerprint[:16]>-<vocab_size>``. ``"hf:<name>"``
    loads a Hugging Face tokenizer (see :meth:`Tokenizer.from_hf`).
    """
    if kind == "byte":
        return Tokenizer.byte()
    if kind == "gpt2":
        return Tokenizer.gpt2()
    if is_hf_kind(kind):
        return Tokenizer.from_hf(kind)
    if kind != "bpe":
        raise ValueError(
            f"tokenizer must be one of {', '.join(KINDS)} or {HF_KIND_HINT}; got {kind!r}"
        )

    vocab_size = check_bpe_vocab_size(vocab_size)
    if corpus_fingerprint is None:
        if train_texts is None:
            raise ValueError("the 'bpe' tokenizer needs train_texts (or a corpus_fingerprint)")
        corpus_fingerprint = texts_fingerprint(train_texts)
    target = Path(cache_dir) / "tokenizers" / f"bpe-{corpus_fingerprint[:16]}-{vocab_size}"
    if (target / META_FILE).is_file():
        return Tokenizer.load(target)
    if train_texts is None:
        raise ValueError(f"no cached bpe tokenizer at {target} and no train_texts to train one")

    tok = Tokenizer.train_bpe(train_texts, vocab_size)
    door.make_folders(target.parent)
    # save into a private folder and rename it in, so readers never see half a tokenizer
    staging = door.make_temp_folder(target.parent, f".{target.name}.")
    try:
        tok.save(staging)
        try:
            door.rename(staging, target)
        except OSError:
            if not (target / META_FILE).is_file():  # lost a race only if the winner finished
                raise
    finally:
        if staging.exists():
            door.remove_tree(staging)
    return tok
