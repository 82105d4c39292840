"""LLaDA and Dream checkpoints in, LLaDA out: tiny random checkpoints written here in each
format, imported, and checked against a reference forward of the format written from its public
description (independently of the backbone), to 1e-5."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from dllm.canvas import mask_token_id, prompt_canvas
from dllm.export import export_llada_model
from dllm.export import main as export_main
from dllm.masked.sampler import sample
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount, front_loaded_counts, reveal_counts
from eval.cli import main as duolm
from shared.checkpoint import load_model_from_checkpoint
from shared.config import ModelConfig
from shared.errors import ConfigError
from shared.formats.importer import import_checkpoint
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer
from shared.tokenizer_backends import bytes_to_unicode
from shared.training import cli

DIM, LAYERS, HEADS, KV_HEADS, HIDDEN, ROWS = 32, 2, 4, 2, 48, 264
HEAD_DIM = DIM // HEADS
THETA, EPS = 10000.0, 1e-5


def write_tokenizer(folder: Path, specials: list[str]) -> None:
    """Bytes at ids 0..255, then ``specials`` from 256 on (as special added tokens)."""
    to_char = bytes_to_unicode()
    backend = Backend(models.BPE(vocab={to_char[b]: b for b in range(256)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    backend.save(str(folder / "tokenizer.json"))


def random_weights(names: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in names.items():
        if "norm" in name or "ln_f" in name:
            weights[name] = 1 + 0.1 * torch.randn(shape, generator=generator)
        else:
            weights[name] = 0.2 * torch.randn(shape, generator=generator)
    return weights


# ---------------------------------------------------------------- LLaDA

LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|eot_id|>"]
LLADA_MASK = 258


def llada_checkpoint(folder: Path, tied: bool = False, qkv_bias: bool = False) -> dict:
    """A tiny LLaDA folder (config.json, model.safetensors, tokenizer.json); returns weights."""
    folder.mkdir(parents=True)
    names = {"model.transformer.wte.weight": (ROWS, DIM), "model.transformer.ln_f.weight": (DIM,)}
    if not tied:
        names["model.transformer.ff_out.weight"] = (ROWS, DIM)
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        block = f"model.transformer.blocks.{i}."
        names |= {
            block + "attn_norm.weight": (DIM,),
            block + "q_proj.weight": (DIM, DIM),
            block + "k_proj.weight": (kv, DIM),
            block + "v_proj.weight": (kv, DIM),
            block + "attn_out.weight": (DIM, DIM),
            block + "ff_norm.weight": (DIM,),
            block + "ff_proj.weight": (HIDDEN, DIM),
            block + "up_proj.weight": (HIDDEN, DIM),
            block + "ff_out.weight": (DIM, HIDDEN),
        }
        if qkv_bias:
            names |= {block + "q_proj.bias": (DIM,), block + "k_proj.bias": (kv,),
                      block + "v_proj.bias": (kv,)}  # fmt: skip
    weights = random_weights(names, seed=1)
    save_file(weights, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": DIM,
        "n_heads": HEADS, "n_kv_heads": KV_HEADS, "n_layers": LAYERS, "mlp_hidden_size": HIDDEN,
        "mlp_ratio": 4, "vocab_size": ROWS, "embedding_size": ROWS, "max_sequence_length": 64,
        "rope": True, "rope_theta": THETA, "rms_norm_eps": EPS, "layer_norm_type": "rms",
        "activation_type": "silu", "block_type": "llama", "alibi": False, "include_bias": False,
        "include_qkv_bias": qkv_bias, "input_emb_norm": False, "scale_logits": False,
        "weight_tying": tied, "mask_token_id": LLADA_MASK, "eos_token_id": 257,
        "pad_token_id": 257,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder, LLADA_SPECIALS)
    return weights


def rms(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def rotary(x):
    """Rotate-half RoPE of x [B, H, T, d] at positions 0..T-1, frequencies in float32."""
    d = x.shape[-1]
    inv = 1.0 / THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.arange(x.shape[2], dtype=torch.float32)[:, None] * inv
    angles = torch.cat([angles, angles], dim=-1)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * angles.cos() + half * angles.sin()


def reference_block(x, w, names, bias: bool):
    """One pre-norm block with full (bidirectional) attention, from weights named by ``names``."""
    batch, length, _ = x.shape

    def project(name, h, heads):
        out = h @ w[names[name] + ".weight"].T
        if bias:
            out = out + w[names[name] + ".bias"]
        return out.view(batch, length, heads, HEAD_DIM).transpose(1, 2)

    h = rms(x, w[names["attn_norm"] + ".weight"])
    q, k, v = project("q", h, HEADS), project("k", h, KV_HEADS), project("v", h, KV_HEADS)
    q, k = rotary(q), rotary(k)
    k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, DIM)
    x = x + attended @ w[names["o"] + ".weight"].T
    h = rms(x, w[names["ff_norm"] + ".weight"])
    gate, up = h @ w[names["gate"] + ".weight"].T, h @ w[names["up"] + ".weight"].T
    return x + (F.silu(gate) * up) @ w[names["down"] + ".weight"].T


def llada_reference(w, tokens, tied=False, bias=False):
    x = w["model.transformer.wte.weight"][tokens]
    for i in range(LAYERS):
        p = f"model.transformer.blocks.{i}."
        names = {"attn_norm": p + "attn_norm", "q": p + "q_proj", "k": p + "k_proj",
                 "v": p + "v_proj", "o": p + "attn_out", "ff_norm": p + "ff_norm",
                 "gate": p + "ff_proj", "up": p + "up_proj", "down": p + "ff_out"}  # fmt: skip
        x = reference_block(x, w, names, bias)
    x = rms(x, w["model.transformer.ln_f.weight"])
    head = w["model.transformer.wte.weight" if tied else "model.transformer.ff_out.weight"]
    return x @ head.T


def swapped(ids: torch.Tensor, first: int, second: int) -> torch.Tensor:
    out = ids.clone()
    out[ids == first], out[ids == second] = second, first
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("tied, bias", [(False, False), (True, False), (False, True)])
def test_imported_llada_equals_the_reference_forward(tmp_path, tied, bias):
    weights = llada_checkpoint(tmp_path / "llada", tied=tied, qkv_bias=bias)
    import_checkpoint(str(tmp_path / "llada"), tmp_path / "run", log=lambda _: None)
    model, tokenizer, state = load_model_from_checkpoint(tmp_path / "run")
    assert state["objective"] == "mdm" and not model.config.shift_logits
    assert state["imported_from"]["mask_row_moved_from"] == LLADA_MASK
    ours_mask = mask_token_id(model, tokenizer)
    assert ours_mask == ROWS - 1 and tokenizer.vocab_size == ROWS - 1
    assert tokenizer.eos_id == 257 and tokenizer.encode("ab") == [97, 98]

    theirs = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    theirs[:, 0] = 256
    theirs[:, 5:12] = LLADA_MASK
    theirs[1, 20] = 259  # a special after the mask id keeps its id
    ours = swapped(theirs, LLADA_MASK, ROWS - 1)
    with torch.no_grad():
        logits = model(ours, "bidirectional")
    # our column j is their column j, but for the two exchanged rows
    columns = swapped(torch.arange(ROWS), LLADA_MASK, ROWS - 1)
    reference = llada_reference(weights, theirs, tied, bias)
    assert (logits[..., columns] - reference).abs().max() < 1e-5


# ---------------------------------------------------------------- Dream

DREAM_SPECIALS = ["<|endoftext|>", "<|beginoftext|>", "<|mask|>"]
DREAM_MASK = 258


def dream_checkpoint(folder: Path) -> dict:
    folder.mkdir(parents=True)
    kv = KV_HEADS * HEAD_DIM
    names = {"model.embed_tokens.weight": (ROWS, DIM), "model.norm.weight": (DIM,),
             "lm_head.weight": (ROWS, DIM)}  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        names |= {
            p + "input_layernorm.weight": (DIM,),
            p + "self_attn.q_proj.weight": (DIM, DIM),
            p + "self_attn.q_proj.bias": (DIM,),
            p + "self_attn.k_proj.weight": (kv, DIM),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, DIM),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (DIM, DIM),
            p + "post_attention_layernorm.weight": (DIM,),
            p + "mlp.gate_proj.weight": (HIDDEN, DIM),
            p + "mlp.up_proj.weight": (HIDDEN, DIM),
            p + "mlp.down_proj.weight": (DIM, HIDDEN),
        }
    weights = random_weights(names, seed=2)
    save_file(weights, str(folder / "model.safetensors"))
    config = {
        "architectures": ["DreamModel"], "model_type": "Dream", "hidden_size": DIM,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS, "intermediate_size": HIDDEN, "vocab_size": ROWS,
        "max_position_embeddings": 64, "rope_theta": THETA, "rms_norm_eps": EPS,
        "hidden_act": "silu", "tie_word_embeddings": False, "mask_token_id": DREAM_MASK,
        "bos_token_id": 257, "eos_token_id": 256, "pad_token_id": 256,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder, DREAM_SPECIALS)
    return weights


def dream_reference(w, tokens):
    """Dream's raw logits: output i is its prediction for token i + 1."""
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        names = {"attn_norm": p + "input_layernorm", "q": p + "self_attn.q_proj",
                 "k": p + "self_attn.k_proj", "v": p + "self_attn.v_proj",
                 "o": p + "self_attn.o_proj", "ff_norm": p + "post_attention_layernorm",
                 "gate": p + "mlp.gate_proj", "up": p + "mlp.up_proj",
                 "down": p + "mlp.down_proj"}  # fmt: skip
        x = reference_block_with_qkv_bias(x, w, names)
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def reference_block_with_qkv_bias(x, w, names):
    # Qwen2: biases on q, k and v only (the o projection has none)
    with_o_bias = dict(w)
    with_o_bias[names["o"] + ".bias"] = torch.zeros(DIM)
    return reference_block(x, with_o_bias, names, bias=True)


@pytest.mark.numerics
def test_imported_dream_equals_the_reference_forward_one_position_on(tmp_path):
    weights = dream_checkpoint(tmp_path / "dream")
    import_checkpoint(str(tmp_path / "dream"), tmp_path / "run", log=lambda _: None)
    model, tokenizer, state = load_model_from_checkpoint(tmp_path / "run")
    assert model.config.shift_logits and model.config.attention_bias
    assert state["objective"] == "mdm" and mask_token_id(model, tokenizer) == ROWS - 1

    theirs = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    theirs[:, 0] = 257
    theirs[:, 8:15] = DREAM_MASK
    ours = swapped(theirs, DREAM_MASK, ROWS - 1)
    with torch.no_grad():
        logits = model(ours, "bidirectional")
    columns = swapped(torch.arange(ROWS), DREAM_MASK, ROWS - 1)
    reference = dream_reference(weights, theirs)
    # Dream's generate reads position i's prediction from output i - 1; so does our model
    assert (logits[:, 1:, columns] - reference[:, :-1]).abs().max() < 1e-5


# ---------------------------------------------------------------- bad input


def test_a_tokenizer_that_uses_the_last_row_cannot_take_the_mask(tmp_path):
    llada_checkpoint(tmp_path / "llada")
    specials = LLADA_SPECIALS + [f"<|reserved_{i}|>" for i in range(ROWS - 256 - 4)]
    write_tokenizer(tmp_path / "llada", specials)
    with pytest.raises(ConfigError, match=f"uses the last embedding row \\({ROWS - 1}\\)"):
        import_checkpoint(str(tmp_path / "llada"), tmp_path / "run")


def test_olmo_options_llada_does_not_use_are_refused_by_name(tmp_path):
    llada_checkpoint(tmp_path / "llada")
    config = json.loads((tmp_path / "llada" / "config.json").read_text())
    (tmp_path / "llada" / "config.json").write_text(json.dumps(config | {"alibi": True}))
    with pytest.raises(ConfigError, match="alibi=True is not supported"):
        import_checkpoint(str(tmp_path / "llada"), tmp_path / "run")


# ---------------------------------------------------------------- LLaDA out


@pytest.mark.numerics
@pytest.mark.parametrize("tied", [False, True])
def test_llada_export_is_the_llada_format_and_round_trips(tmp_path, tied):
    torch.manual_seed(0)
    tokenizer = Tokenizer.byte()
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size + 1, dim=DIM, n_layers=LAYERS,
                      n_heads=HEADS, n_kv_heads=KV_HEADS, hidden_dim=HIDDEN, norm_eps=EPS,
                      rope_theta=THETA, max_seq_len=64, tie_embeddings=tied)  # fmt: skip
    model = Transformer(cfg).eval()
    export_llada_model(model, tokenizer, tmp_path / "llada")
    config = json.loads((tmp_path / "llada" / "config.json").read_text())
    assert config["mask_token_id"] == tokenizer.vocab_size and config["weight_tying"] == tied
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(4))
    tokens[:, 0], tokens[:, 6:14] = tokenizer.eos_id, tokenizer.vocab_size
    exported = load_file(str(tmp_path / "llada" / "model.safetensors"))
    with torch.no_grad():
        logits = model(tokens, "bidirectional")
    assert (llada_reference(exported, tokens, tied) - logits).abs().max() < 1e-5

    import_checkpoint(str(tmp_path / "llada"), tmp_path / "back", log=lambda _: None)
    back, back_tokenizer, state = load_model_from_checkpoint(tmp_path / "back")
    assert state["imported_from"]["mask_row_moved_from"] is None
    assert back_tokenizer.encode("In the beginning") == tokenizer.encode("In the beginning")
    with torch.no_grad():
        assert torch.equal(back(tokens, "bidirectional"), logits)


def test_duolm_export_writes_an_mdm_run_as_llada_and_refuses_other_objectives(tmp_path):
    cache = tmp_path / "cache"
    for objective in ("mdm", "bd"):
        cli.train_from_argv(
            ["--preset", "tiny", "--objective", objective, "--out", str(tmp_path / objective),
             "--cache-dir", str(cache), "--max-steps", "2", "--block-size", "8"]
        )  # fmt: skip
    assert duolm(["export", str(tmp_path / "mdm"), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llada"
    assert json.loads((tmp_path / "out" / "duolm_export.json").read_text())["step"] == 2
    assert duolm(["export", str(tmp_path / "mdm"), str(tmp_path / "out")]) != 0  # used folder
    assert export_main([str(tmp_path / "bd"), str(tmp_path / "bd-out")]) != 0


# ---------------------------------------------------------------- LLaDA's generate


def llada_generate(model, row: torch.Tensor, prompt_length: int, block_length: int, steps: int):
    """LLaDA's reference ``generate`` at temperature 0 with low-confidence remasking, as its
    repository describes it: per block, masked // steps tokens per step and the remainder one
    each to the first steps; at each step the argmax token everywhere, float32 softmax
    confidence, the top-k masked positions of the current block revealed. One change: the
    [MASK] column is dropped before the argmax and the softmax, as this project's models never
    predict [MASK]."""
    x = row.clone()
    mask = model.config.vocab_size - 1
    blocks = (x.shape[1] - prompt_length) // block_length
    per_block = steps // blocks
    for b in range(blocks):
        start = prompt_length + b * block_length
        end = start + block_length
        n = int((x[0, start:end] == mask).sum())
        counts = [n // per_block + (i < n % per_block) for i in range(per_block)]
        for count in counts:
            masked = x[0] == mask
            with torch.no_grad():
                logits = model(x, "bidirectional")[0, :, :mask].float()
            guess = logits.argmax(-1)
            confidence = torch.softmax(logits, -1).gather(-1, guess[:, None])[:, 0]
            confidence[end:] = float("-inf")
            confidence = torch.where(masked, confidence, torch.tensor(float("-inf")))
            chosen = torch.topk(confidence, k=count).indices
            x[0, chosen] = guess[chosen]
    return x


@pytest.mark.numerics
def test_the_llada_reference_option_reproduces_llada_generate_token_for_token(tmp_path):
    """Steps that do not divide a block (6 tokens in 4 steps): LLaDA gives 2, 2, 1, 1, the
    rounded schedule 2, 1, 2, 1, so the default differs from the first step on; the option
    reproduces LLaDA's tokens exactly."""
    llada_checkpoint(tmp_path / "llada")
    import_checkpoint(str(tmp_path / "llada"), tmp_path / "run", log=lambda _: None)
    model, tokenizer, _ = load_model_from_checkpoint(tmp_path / "run")
    masked = torch.tensor([6])
    assert front_loaded_counts(masked, 4).tolist() == [[2, 2, 1, 1]]
    assert reveal_counts(masked, 4).tolist() == [[2, 1, 2, 1]]
    greedy = SamplingConfig(temperature=0.0)
    for prompt in ([97, 98, 99], [100, 101, 102, 103, 104]):
        canvas = prompt_canvas([prompt], 12, bos_id=tokenizer.eos_id,
                               mask_id=mask_token_id(model), max_seq_len=64)  # fmt: skip
        want = llada_generate(model, canvas.tokens, 1 + len(prompt), 6, 8)
        option = FixedCount(8, split="front", confidence="float32")
        config = SamplerConfig(option, block_length=6, sampling=greedy)
        got = sample(model, config, canvas, torch.Generator().manual_seed(0)).tokens
        assert torch.equal(got, want)


def test_llada_reference_options_are_checked():
    with pytest.raises(ValueError, match="split='sideways' must be"):
        FixedCount(4, split="sideways").validate()
    with pytest.raises(ValueError, match="LLaDA's split of the linear schedule"):
        FixedCount(4, split="front", schedule="cosine").validate()
    with pytest.raises(ValueError, match="confidence='float16' must be"):
        FixedCount(4, confidence="float16").validate()
