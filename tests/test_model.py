"""The backbone against hand computation, reference formulas and Hugging Face Llama."""

import math

import pytest
import torch
import torch.nn.functional as F

from shared.attention import (
    flex_attention_problem,
    sliding_window_block_mask,
    use_flex_attention,
)
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.model import (
    FeedForward,
    GroupedQueryAttention,
    RMSNorm,
    Transformer,
    attention_fp32_on_cpu,
    attention_mask,
    flops_per_token,
    rms_norm,
)
from shared.rope import apply_rope, rope_cos_sin
from shared.training.presets import PRESETS, get_preset, resolve_config

TINY = ModelConfig(
    vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, max_seq_len=16
)


def rope_reference(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """Rotate each pair (i, i + d/2) of a vector x [d] by angle position * theta^(-2i/d)."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        angle = position * theta ** (-2 * i / d)
        a, b = x[i].item(), x[i + d // 2].item()
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def test_rope_matches_reference_formula():
    torch.manual_seed(0)
    head_dim, theta = 8, 500.0
    x = torch.randn(1, 1, 5, head_dim)
    cos, sin = rope_cos_sin(torch.arange(5), head_dim, theta)
    rotated = apply_rope(x, cos, sin)
    for position in range(5):
        expected = rope_reference(x[0, 0, position], position, theta)
        torch.testing.assert_close(rotated[0, 0, position], expected, atol=1e-6, rtol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    head_dim = 16
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(m: int, n: int) -> float:
        cos, sin = rope_cos_sin(torch.tensor([m, n]), head_dim, 10000.0)
        qm = apply_rope(q.view(1, 1, 1, -1), cos[:1], sin[:1])
        kn = apply_rope(k.view(1, 1, 1, -1), cos[1:], sin[1:])
        return float((qm * kn).sum())

    for m, n in [(3, 1), (7, 2), (0, 5)]:
        for shift in (1, 10, 100):
            assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_rmsnorm_matches_hand_computation():
    norm = RMSNorm(4, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
    x = torch.tensor([[1.0, -2.0, 3.0, 0.0]])
    rms = math.sqrt((1 + 4 + 9 + 0) / 4 + 1e-6)
    expected = torch.tensor([[1 / rms, -4 / rms, 1.5 / rms, 0.0]])
    torch.testing.assert_close(norm(x), expected)


def test_swiglu_matches_hand_computation():
    ff = FeedForward(dim=2, hidden_dim=3)
    with torch.no_grad():
        ff.w1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        ff.w3.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, -1.0], [0.5, 0.5]]))
        ff.w2.weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, -1.0]]))
    x = torch.tensor([1.0, 2.0])

    def silu(v):
        return v / (1 + math.exp(-v))

    gate = [silu(1.0), silu(2.0), silu(3.0)]
    up = [2.0, -2.0, 1.5]
    hidden = [g * u for g, u in zip(gate, up)]
    expected = torch.tensor([sum(hidden), hidden[1] - hidden[2]])
    torch.testing.assert_close(ff(x), expected)


def manual_attention(attn: GroupedQueryAttention, x, cos, sin, mask):
    """Plain multi-head attention with each KV head shared by its group of query heads."""
    b, t, _ = x.shape
    h, kvh, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = attn.wq(x).view(b, t, h, d).transpose(1, 2)
    k = attn.wk(x).view(b, t, kvh, d).transpose(1, 2).repeat_interleave(h // kvh, dim=1)
    v = attn.wv(x).view(b, t, kvh, d).transpose(1, 2).repeat_interleave(h // kvh, dim=1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return attn.wo(out.transpose(1, 2).reshape(b, t, h * d))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_attention_equals_manual_multi_head(n_kv_heads):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=10, dim=32, n_heads=4, n_kv_heads=n_kv_heads, max_seq_len=8)
    attn = GroupedQueryAttention(cfg)
    x = torch.randn(2, 6, 32)
    cos, sin = rope_cos_sin(torch.arange(6), cfg.head_dim, cfg.rope_theta)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(
        attn(x, cos, sin, None, True),
        manual_attention(attn, x, cos, sin, causal),
        atol=1e-5,
        rtol=1e-5,
    )
    full = torch.ones(6, 6, dtype=torch.bool)
    torch.testing.assert_close(
        attn(x, cos, sin, None, False),
        manual_attention(attn, x, cos, sin, full),
        atol=1e-5,
        rtol=1e-5,
    )


def test_gqa_with_all_kv_heads_is_plain_multi_head_attention():
    """n_kv_heads == n_heads is ordinary MHA: same numbers as SDPA without the GQA path."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=10, dim=32, n_heads=4, n_kv_heads=4, max_seq_len=8)
    attn = GroupedQueryAttention(cfg)
    x = torch.randn(2, 6, 32)
    cos, sin = rope_cos_sin(torch.arange(6), cfg.head_dim, cfg.rope_theta)
    q = apply_rope(attn.wq(x).view(2, 6, 4, 8).transpose(1, 2), cos, sin)
    k = apply_rope(attn.wk(x).view(2, 6, 4, 8).transpose(1, 2), cos, sin)
    v = attn.wv(x).view(2, 6, 4, 8).transpose(1, 2)
    plain = attn.wo(
        F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, 32)
    )
    torch.testing.assert_close(attn(x, cos, sin, None, True), plain)


def test_causal_model_ignores_future_bidirectional_does_not():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    tokens = torch.randint(0, 50, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 50
    with torch.no_grad():
        a = model(tokens, attention="causal")
        b = model(changed, attention="causal")
        torch.testing.assert_close(a[:, :8], b[:, :8], atol=0, rtol=0)
        assert not torch.allclose(a[:, 8:], b[:, 8:])
        c = model(tokens, attention="bidirectional")
        d = model(changed, attention="bidirectional")
        assert (c[:, :8] - d[:, :8]).abs().max() > 1e-4


def test_sliding_window_limits_what_a_position_sees():
    mask = attention_mask(torch.arange(5), torch.arange(5), causal=True, window=2)
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    torch.manual_seed(0)
    cfg = ModelConfig(**{**TINY.to_dict(), "sliding_window": 3})
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 50, (1, 10))
    changed = tokens.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 50
    with torch.no_grad():
        a, b = model(tokens, attention="causal"), model(changed, attention="causal")
    # Information travels at most window-1 positions per layer: 2 layers x 2 positions.
    assert torch.equal(a[0, 5:], b[0, 5:])
    assert not torch.allclose(a[0, 1:3], b[0, 1:3])


def test_ar_and_mdm_models_have_identical_parameters_apart_from_mask_row():
    from shared.objective import build_objective

    ar = build_objective("ar", pad_id=1)
    mdm = build_objective("mdm", pad_id=1)
    for tie in (False, True):
        cfg = ModelConfig(**{**TINY.to_dict(), "tie_embeddings": tie})
        ar_model = Transformer(cfg.with_vocab(ar.model_vocab_size(50)))
        mdm_model = Transformer(cfg.with_vocab(mdm.model_vocab_size(50)))
        ar_shapes = {n: p.shape for n, p in ar_model.named_parameters()}
        mdm_shapes = {n: p.shape for n, p in mdm_model.named_parameters()}
        assert ar_shapes.keys() == mdm_shapes.keys()
        for name, shape in ar_shapes.items():
            if name in ("tok_embeddings.weight", "output.weight"):
                assert mdm_shapes[name] == (shape[0] + 1, shape[1])
            else:
                assert mdm_shapes[name] == shape, name
        extra = mdm_model.num_parameters() - ar_model.num_parameters()
        assert extra == cfg.dim * (1 if tie else 2)


def test_output_mask_selects_positions():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    tokens = torch.randint(0, 50, (2, 7))
    select = torch.rand(2, 7) < 0.5
    with torch.no_grad():
        full = model(tokens, attention="bidirectional")
        part = model(tokens, attention="bidirectional", output_mask=select)
    torch.testing.assert_close(part, full[select])


def test_module_names_follow_llama():
    names = {n for n, _ in Transformer(TINY).named_parameters()}
    for expected in (
        "tok_embeddings.weight",
        "layers.0.attention.wq.weight",
        "layers.0.attention.wk.weight",
        "layers.0.attention.wv.weight",
        "layers.0.attention.wo.weight",
        "layers.1.feed_forward.w1.weight",
        "layers.1.feed_forward.w2.weight",
        "layers.1.feed_forward.w3.weight",
        "layers.0.attention_norm.weight",
        "layers.0.ffn_norm.weight",
        "norm.weight",
        "output.weight",
    ):
        assert expected in names


def test_logits_match_hugging_face_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=61,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=96,
        max_seq_len=32,
        rope_theta=5000.0,
        norm_eps=1e-6,
    )
    ours = Transformer(cfg).eval()
    hf_config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=cfg.max_seq_len,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    hf_config.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    rename = {
        "attention.wq": "self_attn.q_proj",
        "attention.wk": "self_attn.k_proj",
        "attention.wv": "self_attn.v_proj",
        "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    state = {}
    for name, tensor in ours.state_dict().items():
        if name.startswith("layers."):
            for old, new in rename.items():
                name = name.replace(old, new)
            name = "model." + name
        else:
            name = {
                "tok_embeddings.weight": "model.embed_tokens.weight",
                "norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight",
            }[name]
        state[name] = tensor
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    tokens = torch.randint(0, cfg.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(tokens, attention="causal"), hf(tokens).logits, atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("n_kv_heads", 3, ["n_kv_heads=3", "n_heads=4"]),
        ("n_heads", 5, ["n_heads=5", "dim=32"]),
        ("dim", 0, ["dim=0"]),
        ("sliding_window", -1, ["sliding_window=-1"]),
        ("norm_eps", 0.0, ["norm_eps"]),
    ],
)
def test_bad_model_config_names_the_field(field, value, words):
    with pytest.raises(ConfigError) as error:
        ModelConfig(**{**TINY.to_dict(), field: value}).validate()
    for word in words:
        assert word in str(error.value)


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ConfigError, match="preset='huge'.*tiny"):
        get_preset("huge")


def test_every_preset_resolves_to_its_own_shape_with_rows_that_fit_its_context():
    for name in PRESETS:
        preset = get_preset(name)
        model, train = resolve_config(name, {})
        assert {field: getattr(model, field) for field in preset["model"]} == preset["model"]
        assert train.seq_len <= model.max_seq_len, name
    # a preset is handed out as a copy: changing it leaves the named preset as it was
    handed = get_preset("tiny")
    handed["model"]["dim"] += 1
    assert get_preset("tiny")["model"]["dim"] == handed["model"]["dim"] - 1


def test_flops_per_token_by_hand():
    cfg = ModelConfig(vocab_size=100, dim=8, n_layers=2, n_heads=2, n_kv_heads=1, hidden_dim=16)
    per_layer = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8 + 3 * 8 * 16  # wq wk wv wo, w1 w2 w3
    assert flops_per_token(cfg, seq_len=10) == 6 * (2 * per_layer + 8 * 100) + 12 * 2 * 8 * 10


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("window", [0, 5])
def test_cached_forward_equals_uncached(n_kv_heads, window):
    """Prefill, a chunked prefill against a non-empty cache, then one token at a time."""
    from shared.kv_cache import KVCache

    torch.manual_seed(0)
    cfg = ModelConfig(**{**TINY.to_dict(), "n_kv_heads": n_kv_heads, "sliding_window": window})
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 50, (3, 14))
    with torch.no_grad():
        full = model(tokens, attention="causal")
        cache = KVCache(cfg, batch_size=3, max_len=16)
        pieces = [model(tokens[:, :6], attention="causal", cache=cache)]
        pieces.append(model(tokens[:, 6:10], attention="causal", cache=cache))
        for i in range(10, 14):
            pieces.append(model(tokens[:, i : i + 1], attention="causal", cache=cache))
    assert cache.length == 14
    assert cache.keys.shape == (2, 3, n_kv_heads, 16, cfg.head_dim)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_left_padding_with_positions_matches_unpadded_rows():
    from shared.kv_cache import KVCache

    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    short, long = torch.randint(0, 50, (1, 5)), torch.randint(0, 50, (1, 9))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0, 4:], batch[1] = short[0], long[0]
    valid = batch.new_ones(2, 9, dtype=torch.bool)
    valid[0, :4] = False
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(short, attention="causal")
        padded = model(batch, attention="causal", positions=positions, key_valid=valid)
        torch.testing.assert_close(padded[0, 4:], alone[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded[1], model(long, attention="causal")[0])
        cache = KVCache(TINY, batch_size=2, max_len=12)
        prefill = model(
            batch, attention="causal", positions=positions, key_valid=valid, cache=cache
        )
        torch.testing.assert_close(prefill, padded, atol=1e-5, rtol=1e-5)
        step = model(
            torch.tensor([[7], [7]]),
            attention="causal",
            positions=positions[:, -1:] + 1,
            cache=cache,
        )
        ref = model(torch.cat([short, torch.tensor([[7]])], 1), attention="causal")
        torch.testing.assert_close(step[0, 0], ref[0, -1], atol=1e-5, rtol=1e-5)


def test_bidirectional_block_recompute_in_cache_matches_full_forward():
    """Overwriting a block's slots in a filled cache reproduces the full forward there."""
    from shared.kv_cache import KVCache

    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    tokens = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full = model(tokens, attention="bidirectional")
        cache = KVCache(TINY, batch_size=2, max_len=12)
        model(tokens, attention="bidirectional", cache=cache)
        block = model(tokens[:, 4:8], attention="bidirectional", cache=cache, cache_start=4)
    # Layer-1 keys of the block are recomputed from the cached layer-0 keys of everything else,
    # which equal the full forward's, so the result is exact here (the tokens did not change).
    torch.testing.assert_close(block, full[:, 4:8], atol=1e-5, rtol=1e-5)
    assert cache.length == 12


def test_bf16_attention_on_a_cpu_runs_in_fp32():
    """The CPU flash kernel's bf16 backward is slow, so bf16 attention on a CPU is computed in
    fp32 (and cast back): the same result as fp32 SDPA on the bf16 inputs, also under autocast,
    with gradients reaching the bf16 inputs."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).bfloat16().requires_grad_() for _ in range(3))
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention_fp32_on_cpu(q, k, v, None, True, enable_gqa=False)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected.bfloat16())
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16
    fp32 = [t.detach().float() for t in (q, k, v)]
    assert attention_fp32_on_cpu(*fp32, None, True, enable_gqa=False).dtype == torch.float32


def test_rmsnorm_backward_matches_autograd_of_the_formula():
    # float64 oracle: torch.autograd.gradcheck against finite differences, and the gradients
    # of the plain formula w * x / sqrt(mean(x^2) + eps) through autograd
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: rms_norm(a, w, 1e-5), (x, weight))
    grad = torch.randn(3, 5, 8, dtype=torch.float64)
    ours = torch.autograd.grad(rms_norm(x, weight, 1e-5), (x, weight), grad)
    formula = weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    expected = torch.autograd.grad(formula, (x, weight), grad)
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a.double(), b)


def test_rmsnorm_in_bf16_autocast_normalises_in_float32():
    torch.manual_seed(0)
    x = torch.randn(4, 16, requires_grad=True)
    norm = RMSNorm(16, eps=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x)
    assert out.dtype == torch.float32
    out.sum().backward()
    plain = x.detach().clone().requires_grad_()
    (plain / torch.sqrt(plain.pow(2).mean(-1, keepdim=True) + 1e-6)).sum().backward()
    torch.testing.assert_close(x.grad, plain.grad)
    # frozen norm weights: no weight gradient is computed, the input's still is
    norm.weight.requires_grad_(False)
    x.grad = None
    norm(x).sum().backward()
    torch.testing.assert_close(x.grad, plain.grad)


def test_rope_backward_is_the_inverse_rotation():
    torch.manual_seed(0)
    cos, sin = rope_cos_sin(torch.arange(5), 8, 100.0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    cos64, sin64 = cos.double(), sin.double()
    assert torch.autograd.gradcheck(lambda a: apply_rope(a, cos64, sin64), (x,))
    half = 4

    def rotate_half_formula(a):  # the Hugging Face Llama form
        return a * cos64 + torch.cat([-a[..., half:], a[..., :half]], dim=-1) * sin64

    grad = torch.randn_like(x)
    ours = torch.autograd.grad(apply_rope(x, cos64, sin64), x, grad)[0]
    torch.testing.assert_close(ours, torch.autograd.grad(rotate_half_formula(x), x, grad)[0])
    with torch.no_grad():  # the forward without autograd is the same rotation
        torch.testing.assert_close(apply_rope(x, cos64, sin64), rotate_half_formula(x))


def test_output_mask_selecting_every_position_equals_no_mask():
    torch.manual_seed(0)
    model = Transformer(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (2, 7))
    every = torch.ones(2, 7, dtype=torch.bool)
    some = every.clone()
    some[0, 3] = False
    full = model(tokens, "causal")
    torch.testing.assert_close(model(tokens, "causal", output_mask=every), full.flatten(0, 1))
    torch.testing.assert_close(model(tokens, "causal", output_mask=some), full[some])


# ---- flex attention for sliding windows ---------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_the_sliding_window_block_mask_is_the_boolean_mask(causal):
    for length, window in ((16, 4), (20, 7), (8, 8)):
        block_mask = sliding_window_block_mask(length, window, causal, torch.device("cpu"))
        slots = torch.arange(length)
        zero = torch.zeros((), dtype=torch.long)
        elementwise = block_mask.mask_mod(zero, zero, slots[:, None], slots[None, :])
        expected = attention_mask(slots, slots, causal=causal, window=window)
        assert torch.equal(elementwise, expected)


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_flex_and_sdpa_give_the_same_sliding_window_logits(attention):
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(**{**vars(TINY), "sliding_window": 3})  # 4 heads over 2 KV heads
    ).eval()
    tokens = torch.randint(0, TINY.vocab_size, (2, 12))
    with torch.no_grad():
        model.flex_attention = False
        sdpa = model(tokens, attention)
        model.flex_attention = True
        flex = model(tokens, attention)
        # padded rows and cached forwards keep the boolean mask
        padded = model(tokens, attention, key_valid=torch.ones(2, 12, dtype=torch.bool))
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded, sdpa, atol=1e-5, rtol=1e-5)


def test_flex_attention_unavailable_falls_back_to_sdpa_and_says_so_once(caplog):
    assert not use_flex_attention(torch.device("cpu"))  # CPUs keep SDPA, without a probe
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the unavailable path is exercised on CPU-only ones")
    # no CUDA here: the probe fails, which is what a GPU without a working flex looks like
    flex_attention_problem.cache_clear()
    with caplog.at_level("WARNING", logger="shared.attention"):
        assert not use_flex_attention(torch.device("cuda"))
        assert not use_flex_attention(torch.device("cuda"))
    said = [r.getMessage() for r in caplog.records if "flex attention is unavailable" in r.message]
    assert len(said) == 1 and "uses SDPA with a boolean mask" in said[0]
