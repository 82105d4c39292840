"""The "hf:<name>" tokenizer kind, offline: small WordPiece and byte-level BPE tokenizer.json
files are trained here, and the hub is only ever asked for while it is known to be unreachable."""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from shared.config import TOKENIZER_CHOICES, ModelConfig
from shared.data import hub as hub_mod
from shared.data.corpus import CorpusSplits
from shared.data.rows import protocol_record, tokenize_corpus
from shared.errors import ResourceUnavailableError
from shared.tokenizer import Tokenizer
from shared.tokenizer_cache import build_tokenizer
from shared.training.presets import PRESETS

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there, general Kenobi.",
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "Café naïve résumé and emoji 😀 and 日本語.",
] * 10

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# lowercase ASCII words separated by single spaces: the WordPiece byte estimate is exact + 1
PLAIN = ["hello world", "the quick brown fox jumps over the lazy dog", "and there was light"]
UNICODE = ["café naïve résumé", "emoji 😀🎉 and 日本語", "tabs\tand\nnewlines  here\n"]


def _train_wordpiece(path: Path, specials: list[str]) -> Path:
    """BertWordPieceTokenizer-style tokenizer.json, with the BERT post-processor, truncation
    and padding switched on so the tests can check the wrapper switches them off."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    hf_tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    hf_tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    hf_tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf_tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False
    )
    hf_tok.train_from_iterator(SENTENCES, trainer=trainer)
    if "[SEP]" in specials and "[CLS]" in specials:
        sep, cls = hf_tok.token_to_id("[SEP]"), hf_tok.token_to_id("[CLS]")
        hf_tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    hf_tok.enable_truncation(8)
    if "[PAD]" in specials:
        hf_tok.enable_padding(pad_id=hf_tok.token_to_id("[PAD]"), pad_token="[PAD]", length=32)
    hf_tok.save(str(path))
    return path


def _train_byte_level(path: Path) -> Path:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf_tok = HFTokenizer(models.BPE())
    hf_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf_tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    hf_tok.train_from_iterator(SENTENCES, trainer=trainer)
    hf_tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def wp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_wordpiece(tmp_path_factory.mktemp("wp") / "tokenizer.json", BERT_SPECIALS)


@pytest.fixture(scope="module")
def bl_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_byte_level(tmp_path_factory.mktemp("bl") / "tokenizer.json")


@pytest.fixture(scope="module")
def wordpiece(wp_path: Path) -> Tokenizer:
    return Tokenizer.from_hf(f"hf:{wp_path}")


@pytest.fixture(scope="module")
def byte_level(bl_path: Path) -> Tokenizer:
    return Tokenizer.from_hf(f"hf:{bl_path}")


@pytest.fixture(params=["wordpiece", "byte_level"])
def hf_tok(
    request: pytest.FixtureRequest, wordpiece: Tokenizer, byte_level: Tokenizer
) -> Tokenizer:
    return {"wordpiece": wordpiece, "byte_level": byte_level}[request.param]


def test_wordpiece_specials(wordpiece: Tokenizer, wp_path: Path, tmp_path: Path) -> None:
    vocab = json.loads(wp_path.read_text())["model"]["vocab"]
    assert wordpiece.kind == f"hf:{wp_path}"
    assert wordpiece.eos_id == vocab["[SEP]"]
    assert wordpiece.pad_id == vocab["[PAD]"]
    assert wordpiece.vocab_size == len(vocab)
    assert wordpiece.bytes_exact is False
    corpus = CorpusSplits.from_texts("hand", ["Hello World"] * 3, ["Bye"])
    splits = tokenize_corpus(corpus, wordpiece, protocol="padded", seq_len=8, cache_dir=tmp_path)
    record = protocol_record(corpus, wordpiece, splits)
    assert record["tokenizer"]["bytes_exact"] is False  # reports label bits/byte approximate


def test_byte_level_specials_add_a_pad_id(byte_level: Tokenizer, bl_path: Path) -> None:
    vocab = json.loads(bl_path.read_text())["model"]["vocab"]
    assert byte_level.eos_id == vocab["<|endoftext|>"]
    # no pad token in the file: one id is added after the vocabulary
    assert byte_level.pad_id == len(vocab) == byte_level.vocab_size - 1
    assert byte_level.bytes_exact is True


def test_encode_adds_no_specials_and_does_not_truncate(hf_tok: Tokenizer) -> None:
    text = " ".join(PLAIN)  # longer than the file's truncation length of 8
    ids = hf_tok.encode(text)
    assert len(ids) > 8
    assert hf_tok.eos_id not in ids and hf_tok.pad_id not in ids
    assert hf_tok.encode_batch([text, "hi"]) == [ids, hf_tok.encode("hi")]


def test_literal_special_text_is_not_special(hf_tok: Tokenizer) -> None:
    ids = hf_tok.encode("a [SEP] b [PAD] c <|endoftext|> [CLS]")
    assert hf_tok.eos_id not in ids and hf_tok.pad_id not in ids
    # no other special either (decode would drop it): "[CLS]" is read as "[", "cls", "]"
    assert "cls" in hf_tok.decode(ids).lower() and "endoftext" in hf_tok.decode(ids)


@pytest.mark.parametrize("text", PLAIN + ["Hello World THE Fox"])
def test_wordpiece_round_trip_modulo_case(wordpiece: Tokenizer, text: str) -> None:
    ids = wordpiece.encode(text)
    assert wordpiece.decode(ids) == text.lower()
    wrapped = [wordpiece.eos_id, *ids, wordpiece.eos_id, wordpiece.pad_id]
    assert wordpiece.decode(np.array(wrapped)) == text.lower()


@pytest.mark.parametrize("text", PLAIN)
def test_wordpiece_byte_estimate(wordpiece: Tokenizer, text: str) -> None:
    table = wordpiece.token_bytes()
    assert table.shape == (wordpiece.vocab_size,) and table.dtype == np.int64
    assert table[wordpiece.eos_id] == 0 and table[wordpiece.pad_id] == 0
    # each word is counted with the space before it, so the first word adds one byte
    assert int(table[wordpiece.encode(text)].sum()) == len(text.encode("utf-8")) + 1


@pytest.mark.parametrize("text", PLAIN + UNICODE + ["the literal <|endoftext|> stays text"])
def test_byte_level_round_trip_and_exact_bytes(byte_level: Tokenizer, text: str) -> None:
    ids = byte_level.encode(text)
    assert byte_level.decode([byte_level.eos_id, *ids, byte_level.pad_id]) == text
    assert int(byte_level.token_bytes()[ids].sum()) == len(text.encode("utf-8"))


def test_save_load_fingerprint_round_trip(hf_tok: Tokenizer, tmp_path: Path) -> None:
    hf_tok.save(tmp_path / "saved")
    meta = json.loads((tmp_path / "saved" / "tokenizer_meta.json").read_text())
    assert meta["kind"] == hf_tok.kind and meta["bytes_exact"] == hf_tok.bytes_exact
    saved = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())
    assert saved["post_processor"] is None and saved["truncation"] is None
    loaded = Tokenizer.load(tmp_path / "saved")
    assert (loaded.kind, loaded.vocab_size, loaded.eos_id, loaded.pad_id) == (
        hf_tok.kind,
        hf_tok.vocab_size,
        hf_tok.eos_id,
        hf_tok.pad_id,
    )
    assert loaded.bytes_exact == hf_tok.bytes_exact
    assert loaded.fingerprint() == hf_tok.fingerprint()
    assert np.array_equal(loaded.token_bytes(), hf_tok.token_bytes())
    texts = PLAIN + UNICODE
    assert loaded.encode_batch(texts) == hf_tok.encode_batch(texts)
    ids = hf_tok.encode_batch(texts)
    assert [loaded.decode(i) for i in ids] == [hf_tok.decode(i) for i in ids]


def test_fingerprint_ignores_the_path(wp_path: Path, wordpiece: Tokenizer, tmp_path: Path) -> None:
    copy = shutil.copy(wp_path, tmp_path / "elsewhere.json")
    # a folder holding tokenizer.json is accepted too
    assert Tokenizer.from_hf(f"hf:{copy}").fingerprint() == wordpiece.fingerprint()
    assert Tokenizer.from_hf(f"hf:{wp_path.parent}").fingerprint() == wordpiece.fingerprint()


def test_fingerprints_differ(wordpiece: Tokenizer, byte_level: Tokenizer) -> None:
    prints = {wordpiece.fingerprint(), byte_level.fingerprint(), Tokenizer.byte().fingerprint()}
    assert len(prints) == 3


def test_build_tokenizer_accepts_hf(wp_path: Path, wordpiece: Tokenizer, tmp_path: Path) -> None:
    built = build_tokenizer(f"hf:{wp_path}", cache_dir=tmp_path)
    assert built.fingerprint() == wordpiece.fingerprint()
    with pytest.raises(ValueError, match=r"byte, gpt2, bpe or hf:"):
        build_tokenizer("sentencepiece", cache_dir=tmp_path)


def test_tokenize_corpus_padded(hf_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("tiny", SENTENCES[:5] * 4, SENTENCES[5:7])
    splits = tokenize_corpus(corpus, hf_tok, protocol="padded", seq_len=32, cache_dir=tmp_path)
    rows = splits["train"].tokens
    assert rows.shape[1] == 32 and rows.shape[0] > 0
    assert (rows[:, 0] == hf_tok.eos_id).all()
    assert (rows == hf_tok.pad_id).any()
    assert int(rows.max()) < hf_tok.vocab_size
    assert splits["train"].n_bytes > 0 and splits["validation"].n_rows > 0


def test_missing_eos_lists_the_tokens_found(tmp_path: Path) -> None:
    path = _train_wordpiece(tmp_path / "tokenizer.json", ["[PAD]", "[UNK]"])
    with pytest.raises(ValueError, match=r"end-of-text.*\[SEP\].*\['\[PAD\]', '\[UNK\]'\]"):
        Tokenizer.from_hf(f"hf:{path}")


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such tokenizer.json"):
        Tokenizer.from_hf(f"hf:{tmp_path / 'nope' / 'tokenizer.json'}")


def _refuse_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried the network while offline")

    monkeypatch.setattr(HFTokenizer, "from_pretrained", no_network)


def test_offline_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_hub(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ResourceUnavailableError) as info:
        Tokenizer.from_hf("hf:no-such-user/no-such-tokenizer")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "'hf:no-such-user/no-such-tokenizer'" in message
    assert "hub is unreachable" in message and "HF_HUB_OFFLINE" in message
    assert "tokenizer.json" in message and "'byte'" in message


def test_unresolvable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_hub(monkeypatch)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub_mod, "hub_unreachable", lambda: True)
    with pytest.raises(ResourceUnavailableError, match="does not resolve"):
        build_tokenizer("hf:no-such-user/no-such-tokenizer", cache_dir=Path("/nonexistent"))


def test_tokenizer_choices() -> None:
    for ok in ("byte", "gpt2", "bpe", "hf:bert-base-uncased", "hf:/x/tokenizer.json"):
        assert ok in TOKENIZER_CHOICES
    for bad in ("hf:", "hf:  ", "sentencepiece", "", 3):
        assert bad not in TOKENIZER_CHOICES
    assert "hf:<" in repr(TOKENIZER_CHOICES)


def test_lm1b_preset() -> None:
    preset = PRESETS["lm1b-small"]
    model = ModelConfig(**preset["model"]).validate()
    assert (model.dim, model.n_layers, model.max_seq_len, model.tie_embeddings) == (
        768,
        12,
        128,
        True,
    )
    train = preset["train"]
    assert train["tokenizer"] in TOKENIZER_CHOICES
    assert (train["dataset"], train["protocol"], train["seq_len"]) == ("lm1b", "padded", 128)
