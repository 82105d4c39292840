"""The AR generation engine: cached vs uncached decoding, ragged batches, stopping, streaming,
bad input, and the sampling CLI end to end on a freshly trained tiny checkpoint."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from arlm.decoding import left_pad
from arlm.generate import ARGenerator, GenerationConfig, check_prompts
from shared.checkpoint import full_model_state, save_checkpoint
from shared.config import ModelConfig
from shared.kv_cache import KVCache
from shared.model import Transformer, attention_mask
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
TINY = ModelConfig(
    vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, max_seq_len=48
)
GREEDY = SamplingConfig(temperature=0)


def make_model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**TINY.to_dict(), **changes})).eval()


def random_prompts(lengths: list[int], vocab: int = 50, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def greedy(max_new_tokens: int, **changes) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=max_new_tokens, sampling=GREEDY, stop_on_eos=False, **changes
    )


# ---------------------------------------------------------------- cached vs uncached


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("lengths", [[5], [1, 7, 3], [12, 12, 12, 12]])
def test_cached_greedy_equals_uncached(n_kv_heads, lengths):
    engine = ARGenerator(make_model(n_kv_heads=n_kv_heads), eos_id=None)
    prompts = random_prompts(lengths)
    cached = engine.generate(prompts, greedy(10, return_logits=True))
    uncached = engine.generate(prompts, greedy(10, return_logits=True, use_cache=False))
    assert cached.tokens == uncached.tokens
    assert all(len(row) == 10 for row in cached.tokens)
    torch.testing.assert_close(cached.logits, uncached.logits, atol=1e-5, rtol=1e-5)
    assert cached.forward_passes == uncached.forward_passes == 10  # 1 prefill + 9 steps


@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_chunked_prefill_equals_one_forward(chunk):
    engine = ARGenerator(make_model(), eos_id=None)
    prompts = random_prompts([1, 7, 11])
    whole = engine.generate(prompts, greedy(6, return_logits=True))
    chunked = engine.generate(prompts, greedy(6, return_logits=True, prefill_chunk_size=chunk))
    assert chunked.tokens == whole.tokens
    torch.testing.assert_close(chunked.logits, whole.logits, atol=1e-5, rtol=1e-5)
    assert chunked.forward_passes == math.ceil(11 / chunk) + 5


def test_sliding_window_model_cached_equals_uncached():
    """Past the window the decode step falls back to the model's full mask path."""
    engine = ARGenerator(make_model(sliding_window=5), eos_id=None)
    prompts = random_prompts([2, 9])
    cached = engine.generate(prompts, greedy(12, return_logits=True))
    uncached = engine.generate(prompts, greedy(12, return_logits=True, use_cache=False))
    assert cached.tokens == uncached.tokens
    torch.testing.assert_close(cached.logits, uncached.logits, atol=1e-5, rtol=1e-5)


def test_left_padding_layout():
    tokens, valid, positions = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert valid.tolist() == [[True, True, True], [False, False, True]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]


# ---------------------------------------------------------------- the model's decode paths


def test_cache_picks_the_cheapest_correct_mask():
    """Prefill into an empty cache: SDPA's is_causal, no mask. One appended token: no mask,
    or the padding slots straight from cache.valid. Anything else: the full mask."""
    model = make_model()
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, :2] = False
    slots = torch.arange(6)
    with torch.no_grad():
        cache = KVCache(model.config, 2, 12)
        assert model._cached_mask("causal", cache, slots, 0, None) == (None, True)
        assert not cache.has_padding and cache.length == 6
        mask, is_causal = model._cached_mask("causal", cache, torch.arange(6, 7), 6, None)
        assert mask is None and not is_causal
        cache = KVCache(model.config, 2, 12)
        mask, _ = model._cached_mask("causal", cache, slots, 0, valid)
        assert cache.has_padding and mask.shape == (2, 1, 6, 6)
        mask, _ = model._cached_mask("causal", cache, torch.arange(6, 7), 6, None)
        assert torch.equal(mask, cache.valid[:, None, None, :7])
        mask, _ = model._cached_mask("causal", cache, torch.arange(7, 9), 7, None)
        assert mask.shape == (2, 1, 2, 9)  # two tokens at once: the full mask
        # rewriting every slot without padding makes the cache unpadded again
        model._cached_mask("causal", cache, torch.arange(9), 0, None)
        assert not cache.has_padding


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_single_query_gqa_equals_sdpa_with_enable_gqa(n_kv_heads):
    from shared.model import GroupedQueryAttention

    torch.manual_seed(0)
    attention = GroupedQueryAttention(ModelConfig(**{**TINY.to_dict(), "n_kv_heads": n_kv_heads}))
    q = torch.randn(3, 4, 1, 8)
    k, v = torch.randn(3, n_kv_heads, 10, 8), torch.randn(3, n_kv_heads, 10, 8)
    mask = torch.rand(3, 1, 1, 10) < 0.7
    mask[..., -1] = True
    for m in (None, mask):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        got = attention._single_query_gqa(q, k, v, m)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_padded_decode_step_equals_the_explicit_mask_path():
    model = make_model(n_kv_heads=1)
    tokens, valid, positions = left_pad(random_prompts([3, 7]), pad_id=0)
    step = torch.tensor([[4], [9]])
    outputs = []
    with torch.no_grad():
        for explicit in (False, True):
            cache = KVCache(model.config, 2, 10)
            model(tokens, "causal", positions=positions, key_valid=valid, cache=cache)
            attention = "causal"
            if explicit:  # the general path: a boolean mask tensor used as given
                attention = attention_mask(
                    torch.arange(7, 8), torch.arange(8), causal=True, key_valid=cache.valid[:, :8]
                )
            outputs.append(model(step, attention, positions=positions[:, -1:] + 1, cache=cache))
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- batch invariance


@pytest.mark.parametrize("penalty", [1.0, 1.3])
@pytest.mark.parametrize("use_cache", [True, False])
def test_rows_of_a_ragged_batch_equal_their_prompt_alone(penalty, use_cache):
    engine = ARGenerator(make_model(n_kv_heads=1), eos_id=None)
    prompts = random_prompts([3, 9, 1, 6])
    config = GenerationConfig(
        max_new_tokens=12,
        sampling=SamplingConfig(temperature=0, repetition_penalty=penalty),
        stop_on_eos=False,
        use_cache=use_cache,
        return_logits=True,
    )
    batch = engine.generate(prompts, config)
    for row, prompt in enumerate(prompts):
        alone = engine.generate([prompt], config)
        assert batch.tokens[row] == alone.tokens[0]
        torch.testing.assert_close(batch.logits[row], alone.logits[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- stopping


def first_end(row: list[int], ends) -> int | None:
    """Index of the token at which ``ends(prefix)`` first holds, or None."""
    for i in range(len(row)):
        if ends(row[: i + 1]):
            return i
    return None


def test_eos_stops_each_row_on_its_own():
    model = make_model()
    prompts = random_prompts([4, 2, 8, 5])
    reference = ARGenerator(model, eos_id=None).generate(prompts, greedy(16)).tokens
    # an id that some row first produces at step >= 2, so that row certainly ends early
    chosen, step = next(
        (row, i)
        for row, tokens in enumerate(reference)
        for i in range(2, 16)
        if tokens[i] not in tokens[:i]
    )
    eos = reference[chosen][step]
    config = GenerationConfig(max_new_tokens=16, sampling=GREEDY)
    result = ARGenerator(model, eos_id=eos).generate(prompts, config)
    assert result.tokens[chosen] == reference[chosen][: step + 1]
    for row, expected in enumerate(reference):
        end = first_end(expected, lambda prefix: prefix[-1] == eos)
        if end is None:
            assert result.tokens[row] == expected and result.finish_reasons[row] == "length"
        else:
            assert result.tokens[row] == expected[: end + 1]
            assert result.finish_reasons[row] == "eos"
    assert result.forward_passes == max(len(row) for row in result.tokens)


def test_stop_sequences_stop_each_row_on_its_own():
    model = make_model()
    prompts = random_prompts([4, 2, 8, 5])
    reference = ARGenerator(model, eos_id=None).generate(prompts, greedy(16)).tokens
    stops = (tuple(reference[1][5:7]), (reference[2][9],))
    result = ARGenerator(model, eos_id=None).generate(prompts, greedy(16, stop_sequences=stops))
    hit_any = False
    for row, expected in enumerate(reference):
        end = first_end(expected, lambda prefix: any(tuple(prefix[-len(s) :]) == s for s in stops))
        if end is None:
            assert result.tokens[row] == expected and result.finish_reasons[row] == "length"
        else:
            hit_any = True
            assert result.tokens[row] == expected[: end + 1]
            assert result.finish_reasons[row] == "stop"
    assert hit_any and result.finish_reasons[1] == "stop"


def byte_model(seed: int = 0) -> tuple[Transformer, Tokenizer]:
    tokenizer = Tokenizer.byte()
    return make_model(seed, vocab_size=tokenizer.vocab_size), tokenizer


def raw_bytes(tokenizer: Tokenizer, ids: list[int]) -> bytes:
    return b"".join(tokenizer.id_to_bytes(i) for i in ids)


def test_stop_strings_cut_the_text_and_stop_each_row():
    model, tokenizer = byte_model()
    engine = ARGenerator(model, tokenizer)
    prompts = ["In the beginning", "God", "and the earth"]
    plain = engine.generate(prompts, greedy(24))
    # two consecutive printable ASCII bytes of some row make a stop string it certainly meets
    chosen, start = next(
        (row, i)
        for row, tokens in enumerate(plain.tokens)
        for i in range(23)
        if all(32 <= t < 127 for t in tokens[i : i + 2])
    )
    stop = bytes(plain.tokens[chosen][start : start + 2]).decode()
    result = engine.generate(prompts, greedy(24, stop_strings=(stop,)))
    for row, expected in enumerate(plain.tokens):
        end = first_end(expected, lambda prefix: stop.encode() in raw_bytes(tokenizer, prefix))
        if end is None:
            assert result.tokens[row] == expected and result.finish_reasons[row] == "length"
            assert result.texts[row] == tokenizer.decode(expected)
        else:
            assert result.tokens[row] == expected[: end + 1]
            assert result.finish_reasons[row] == "stop"
            text = tokenizer.decode(expected[: end + 1])
            assert result.texts[row] == text[: text.index(stop)]
    assert result.finish_reasons[chosen] == "stop"


def test_max_new_tokens_zero_returns_empty_rows():
    engine = ARGenerator(make_model(), eos_id=None)
    result = engine.generate([[1, 2], [3]], greedy(0))
    assert result.tokens == [[], []] and result.forward_passes == 0
    assert result.finish_reasons == ["length", "length"]


# ---------------------------------------------------------------- sampling through the engine


def test_temperature_zero_is_greedy_whatever_the_filters():
    engine = ARGenerator(make_model(), eos_id=None)
    prompts = random_prompts([3, 6])
    plain = engine.generate(prompts, greedy(10)).tokens
    filtered = GenerationConfig(
        max_new_tokens=10,
        sampling=SamplingConfig(temperature=0, top_k=3, top_p=0.5, min_p=0.2),
        stop_on_eos=False,
    )
    assert engine.generate(prompts, filtered, seed=5).tokens == plain
    # and it equals the argmax of the returned logits at every step
    logits = engine.generate(prompts, greedy(10, return_logits=True)).logits
    assert logits.argmax(-1).tolist() == plain


def test_a_seed_reproduces_samples():
    engine = ARGenerator(make_model(), eos_id=None)
    prompts = random_prompts([3, 6])
    config = GenerationConfig(
        max_new_tokens=16, sampling=SamplingConfig(temperature=1.5, top_p=0.95), stop_on_eos=False
    )
    first = engine.generate(prompts, config, seed=7).tokens
    assert engine.generate(prompts, config, generator=torch.Generator().manual_seed(7)).tokens == (
        first
    )
    assert engine.generate(prompts, config, seed=8).tokens != first


# ---------------------------------------------------------------- streaming


@pytest.mark.parametrize("stops", [True, False])
def test_streaming_yields_the_tokens_and_text_of_the_plain_call(stops):
    model, tokenizer = byte_model(seed=3)
    engine = ARGenerator(model, tokenizer)
    prompts = ["In the", "And God said", ""]
    reference = engine.generate(prompts, greedy(20)).tokens
    config = GenerationConfig(
        max_new_tokens=20,
        sampling=SamplingConfig(temperature=0.9, top_k=40),
        stop_on_eos=stops,
        stop_sequences=(tuple(reference[1][4:6]),) if stops else (),
        stop_strings=("e", "th") if stops else (),
    )
    plain = engine.generate(prompts, config, seed=11)
    stream = engine.stream(prompts, config, seed=11)
    assert stream.result is None
    tokens = [[] for _ in prompts]
    texts = ["" for _ in prompts]
    steps = list(stream)
    for step in steps:
        for row, token in enumerate(step.tokens):
            if token is not None:
                tokens[row].append(token)
            texts[row] += step.texts[row]
    assert tokens == plain.tokens == stream.result.tokens
    assert texts == plain.texts == stream.result.texts
    assert all(steps[-1].finished)
    assert stream.result.finish_reasons == plain.finish_reasons
    assert ("stop" in plain.finish_reasons) == stops
    # the callback form sees the same steps
    seen = []
    engine.generate(prompts, config, seed=11, on_step=seen.append)
    assert [s.tokens for s in seen] == [s.tokens for s in steps]


def test_stream_holds_back_text_a_stop_string_may_remove():
    model, tokenizer = byte_model(seed=3)
    engine = ARGenerator(model, tokenizer)
    text = engine.generate(["In the"], greedy(20)).texts[0]
    # the last two printable ASCII characters in a row (a replacement character stands for an
    # invalid byte, which a stop string cannot match)
    at = max(
        i
        for i in range(len(text) - 1)
        if all(c.isascii() and c.isprintable() for c in text[i : i + 2])
    )
    stop = text[at : at + 2]
    deltas = [step.texts[0] for step in engine.stream(["In the"], greedy(20, stop_strings=(stop,)))]
    final = "".join(deltas)
    assert final == text[: text.index(stop)]
    released = ""
    for delta in deltas:
        released += delta
        assert final.startswith(released)  # nothing released is ever taken back


def test_stream_holds_back_tokens_a_stop_sequence_may_remove():
    model, tokenizer = byte_model(seed=3)
    engine = ARGenerator(model, tokenizer)
    tokens = engine.generate(["In the"], greedy(20)).tokens[0]
    # two printable ASCII tokens: their text is visible, so releasing it early would show
    at = max(i for i in range(19) if all(32 <= t < 127 for t in tokens[i : i + 2]))
    stop = tuple(tokens[at : at + 2])
    first = next(i for i in range(19) if tuple(tokens[i : i + 2]) == stop)
    steps = list(engine.stream(["In the"], greedy(20, stop_sequences=(stop,))))
    deltas = [step.texts[0] for step in steps]
    assert [step.tokens[0] for step in steps] == tokens[: first + 2]
    final = "".join(deltas)
    assert final == tokenizer.decode(tokens[:first])
    released = ""
    for delta in deltas:
        released += delta
        assert final.startswith(released)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "prompts, changes, words",
    [
        ([], {}, ["prompts is empty"]),
        ([[1], []], {}, ["prompts[1] is empty"]),
        ([[1] * 49], {"max_new_tokens": 0}, ["prompt length 49", "max_seq_len=48"]),
        ([[1] * 40, [2]], {"max_new_tokens": 9}, ["max_new_tokens=9", "at most 8"]),
        ([[1, 50]], {}, ["token id 50", "[0, 50)"]),
        ([[1]], {"max_new_tokens": -1}, ["max_new_tokens=-1", ">= 0"]),
        ([[1]], {"sampling": SamplingConfig(top_p=0.0)}, ["top_p=0.0", "(0, 1]"]),
        ([[1]], {"sampling": SamplingConfig(top_p=1.5)}, ["top_p=1.5", "(0, 1]"]),
        ([[1]], {"sampling": SamplingConfig(temperature=-0.5)}, ["temperature=-0.5", ">= 0"]),
        ([[1]], {"stop_strings": ("x",)}, ["stop_strings", "tokenizer"]),
        ([[1]], {"stop_sequences": ((),)}, ["stop_sequences"]),
        ([[1]], {"prefill_chunk_size": -2}, ["prefill_chunk_size=-2"]),
        (["text"], {}, ["text prompts need a tokenizer"]),
    ],
)
def test_bad_input_raises_a_clear_value_error(prompts, changes, words):
    engine = ARGenerator(make_model(), eos_id=None)
    config = GenerationConfig(**{"max_new_tokens": 4, **changes})
    with pytest.raises(ValueError) as error:
        engine.generate(prompts, config)
    for word in words:
        assert word in str(error.value)


def test_a_batch_that_exactly_fits_generates_to_the_end_of_the_context():
    prompts = [[1] * 40, [2]]  # the longest prompt plus 8 new tokens is max_seq_len=48
    assert check_prompts(prompts, vocab_size=50, max_seq_len=48, max_new_tokens=8) is None
    result = ARGenerator(make_model(), eos_id=None).generate(prompts, greedy(8))
    assert [len(row) for row in result.tokens] == [8, 8]
    assert result.finish_reasons == ["length", "length"]
    # one token more does not fit, and the message says how many do
    with pytest.raises(ValueError, match="at most 8"):
        check_prompts(prompts, vocab_size=50, max_seq_len=48, max_new_tokens=9)


def test_a_single_string_is_not_a_prompt_list():
    model, tokenizer = byte_model()
    with pytest.raises(ValueError, match="list of prompts"):
        ARGenerator(model, tokenizer).generate("In the beginning", greedy(2))


def save_fake_checkpoint(root: Path, objective: str) -> Path:
    tokenizer = Tokenizer.byte()
    extra = 1 if objective == "mdm" else 0  # the diffusion model's [MASK] row
    model = make_model(vocab_size=tokenizer.vocab_size + extra)
    state = {"objective": objective, "model_config": model.config.to_dict()}
    weights = full_model_state(model)
    return save_checkpoint(root, 1, weights=weights, tokenizer=tokenizer, state=state)


def test_mdm_checkpoint_is_refused(tmp_path):
    path = save_fake_checkpoint(tmp_path, "mdm")
    with pytest.raises(ValueError, match="objective='mdm'.*'ar'"):
        ARGenerator.from_checkpoint(path)


# ---------------------------------------------------------------- command line


@pytest.fixture
def ar_run(tiny_runs) -> Path:
    return tiny_runs["ar"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arlm.sample", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_samples_from_a_trained_checkpoint(ar_run, tmp_path):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("And God\n")
    done = run_cli(
        str(ar_run),
        "--prompt",
        "In the beginning",
        "--prompts-file",
        str(prompts_file),
        "--max-new-tokens",
        "12",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--stop",
        "\n",
    )
    assert done.returncode == 0, done.stderr
    assert "=== sample 0" in done.stdout and "=== sample 1" in done.stdout
    assert "In the beginning" in done.stdout and "And God" in done.stdout
    assert "tok/s" in done.stdout and "forward passes" in done.stdout
    # the same seed through the API gives the same text
    engine = ARGenerator.from_checkpoint(ar_run)
    config = GenerationConfig(
        max_new_tokens=12,
        sampling=SamplingConfig(temperature=0.8, top_k=20, top_p=0.9),
        stop_strings=("\n",),
    )
    result = engine.generate(["In the beginning", "And God"], config, seed=3)
    assert f"In the beginning{result.texts[0]}\n" in done.stdout


def test_cli_streams_greedy_text_like_the_plain_run(ar_run):
    common = [str(ar_run), "--prompt", "In the", "--max-new-tokens", "10", "--temperature", "0"]
    plain, streamed = run_cli(*common), run_cli(*common, "--stream", "--no-cache")
    assert plain.returncode == 0 and streamed.returncode == 0, plain.stderr + streamed.stderr
    first_text = plain.stdout.splitlines()[1]
    assert streamed.stdout.splitlines()[1] == first_text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "x", "--top-p", "1.5"], "error: top_p=1.5 must be in (0, 1]"),
        (["--prompt", "x", "--max-new-tokens", "100"], "max_new_tokens=100"),
        ([], "no prompts"),
    ],
)
def test_cli_user_errors_exit_2_with_one_line(ar_run, args, message):
    done = run_cli(str(ar_run), *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_cli_refuses_an_mdm_checkpoint(tmp_path):
    path = save_fake_checkpoint(tmp_path, "mdm")
    done = run_cli(str(path), "--prompt", "x")
    assert done.returncode == 2 and "objective='mdm'" in done.stderr
    assert "Traceback" not in done.stderr
