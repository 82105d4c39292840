"""A checkpoint's model is built on the meta device and compared with its weights' safetensors
header before anything of its size is allocated: a few-KB checkpoint whose state.json asks for
13B parameters is refused in one line naming the first tensor that differs, a header that
declares more bytes than its file holds is refused, and a normal checkpoint loads to the same
outputs as a model built for real."""

import json
import struct
from pathlib import Path

import pytest
import torch
from helpers import copy_of, relist

from shared import checkpoint as ckpt
from shared import model as model_module
from shared.config import ModelConfig
from shared.errors import CheckpointError
from shared.model import Transformer
from shared.tensor_files import read_tensor_header

STEP = "step_000002"
# Llama-2-13B's shape: 13 billion parameters, 52 GB in float32
HUGE = {"dim": 5120, "n_heads": 40, "n_kv_heads": 40, "hidden_dim": 13824, "vocab_size": 32000}


@pytest.fixture
def no_real_model_built(monkeypatch):
    """Fails the test if a model is built anywhere but on the meta device while the crafted
    checkpoint is read (before a single tensor of it is allocated)."""
    built = []
    real_init = Transformer.__init__

    def watched(self, cfg):
        device = torch.get_default_device()
        built.append(device.type)
        if device.type != "meta" and cfg.dim == HUGE["dim"]:
            raise AssertionError(f"a {cfg.dim}-wide model was built on {device}")
        real_init(self, cfg)

    monkeypatch.setattr(model_module.Transformer, "__init__", watched)
    return built


def crafted(tiny_run: Path, tmp_path: Path, **model_config) -> Path:
    """A copy of the run whose checkpoint's state.json asks for ``model_config``, its manifest
    rewritten as whoever crafted it would."""
    checkpoint = copy_of(tiny_run, tmp_path) / "checkpoints" / STEP
    state = json.loads((checkpoint / "state.json").read_text())
    state["model_config"].update(model_config)
    (checkpoint / "state.json").write_text(json.dumps(state))
    relist(checkpoint)
    return checkpoint


def test_a_tiny_checkpoint_asking_for_13b_parameters_is_refused_unbuilt(
    tiny_run, tmp_path, no_real_model_built
):
    layers = json.loads((tiny_run / "checkpoints" / STEP / "state.json").read_text())
    n_layers = layers["model_config"]["n_layers"]
    checkpoint = crafted(tiny_run, tmp_path, **HUGE, n_layers=n_layers)
    with pytest.raises(CheckpointError) as refused:
        ckpt.load_model_from_checkpoint(checkpoint)
    message = str(refused.value)
    assert "\n" not in message and "tensors have another shape" in message
    assert "(5120" in message  # the first differing tensor, with both shapes
    assert no_real_model_built == ["meta"]


def test_more_layers_than_the_weights_hold_is_refused_before_any_model(
    tiny_run, tmp_path, no_real_model_built
):
    checkpoint = crafted(tiny_run, tmp_path, **HUGE, n_layers=1_000_000)
    with pytest.raises(CheckpointError, match="n_layers=1000000, but its weights hold"):
        ckpt.load_model_from_checkpoint(checkpoint)
    assert no_real_model_built == []


def test_a_header_declaring_more_bytes_than_its_file_is_refused(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [5120, 5120], "data_offsets": [0, 5120 * 5120 * 4]}}
    text = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 16)
    with pytest.raises(CheckpointError, match="tensor w declares .* do not hold"):
        read_tensor_header(path, error=CheckpointError)
    path.write_bytes(struct.pack("<Q", 1 << 40) + text)
    with pytest.raises(CheckpointError, match="header length does not fit"):
        read_tensor_header(path, error=CheckpointError)


def test_weights_of_a_type_a_model_cannot_hold_are_named(tiny_run, tmp_path):
    checkpoint = copy_of(tiny_run, tmp_path) / "checkpoints" / STEP
    weights = checkpoint / ckpt.WEIGHTS
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].to(torch.int32)
    save_file(tensors, weights)
    relist(checkpoint)
    with pytest.raises(CheckpointError, match=f"tensor {first} is stored as I32"):
        ckpt.load_model_from_checkpoint(checkpoint)


def test_a_checkpoint_loads_to_the_outputs_of_a_model_built_for_real(tiny_run):
    checkpoint = tiny_run / "checkpoints" / STEP
    loaded, _, state = ckpt.load_model_from_checkpoint(checkpoint)
    real = Transformer(ModelConfig.from_dict(state["model_config"]))
    ckpt.load_weights(checkpoint, real)
    real.eval()
    tokens = torch.randint(0, loaded.config.vocab_size - 1, (2, 16), generator=torch.Generator())
    with torch.no_grad():
        assert torch.equal(loaded(tokens, "bidirectional"), real(tokens, "bidirectional"))
    assert all(p.device.type == "cpu" for p in loaded.parameters())


def test_a_model_made_real_from_meta_keeps_its_tied_head_and_rope_tables():
    cfg = ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=2, hidden_dim=32)
    cfg = ModelConfig(**{**cfg.to_dict(), "tie_embeddings": True, "max_seq_len": 32})
    with torch.device("meta"):
        model = Transformer(cfg)
    model.materialise("cpu")
    real = Transformer(cfg)
    assert model.output.weight is model.tok_embeddings.weight
    assert torch.equal(model.rope_cos, real.rope_cos) and torch.equal(model.rope_sin, real.rope_sin)


def test_a_resume_of_a_crafted_checkpoint_is_refused_before_its_model_is_built(
    tiny_run, tmp_path, cache_dir, no_real_model_built
):
    from shared.training import cli

    layers = json.loads((tiny_run / "checkpoints" / STEP / "state.json").read_text())
    checkpoint = crafted(tiny_run, tmp_path, **HUGE, n_layers=layers["model_config"]["n_layers"])
    run = checkpoint.parent.parent
    argv = ["--resume", str(run), "--max-steps", "4", "--cache-dir", str(cache_dir)]
    with pytest.raises(CheckpointError, match="tensors have another shape") as refused:
        cli.train_from_argv(argv)
    assert "\n" not in str(refused.value) and "meta" in no_real_model_built


def test_a_resume_of_a_crafted_sharded_checkpoint_is_refused_before_its_model_is_built(
    tmp_path, cache_dir, no_real_model_built
):
    """A sharded checkpoint's checked index declares its weights' shapes: a state.json asking
    for 13B parameters beside it is refused as a single-file one is, with only a meta model."""
    from shared.training import cli

    run = tmp_path / "sharded"
    flags = ["--preset", "tiny", "--cache-dir", str(cache_dir), "--checkpoint-format", "sharded"]
    cli.train_from_argv([*flags, "--out", str(run), "--max-steps", "2"])
    checkpoint = run / "checkpoints" / STEP
    state = json.loads((checkpoint / "state.json").read_text())
    state["model_config"].update(HUGE)
    (checkpoint / "state.json").write_text(json.dumps(state))
    relist(checkpoint)
    argv = ["--resume", str(run), "--max-steps", "4", "--cache-dir", str(cache_dir)]
    with pytest.raises(CheckpointError, match="tensors have another shape") as refused:
        cli.train_from_argv(argv)
    assert "\n" not in str(refused.value) and "(5120" in str(refused.value)
    assert "meta" in no_real_model_built


def test_an_import_whose_config_asks_for_a_million_layers_is_refused_unbuilt(
    tmp_path, capsys, no_real_model_built
):
    pytest.importorskip("transformers")
    from shared.formats.importer import main
    from tests.test_import import save_hf, tiny_hf_model

    folder = save_hf(tiny_hf_model("llama"), tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    capsys.readouterr()  # transformers' progress bars while it saved the folder
    # the small case first: without the check it fails at once, before a million meta layers
    for layers, said in ((1, "hold more"), (1_000_000, "have no model.layers.999999")):
        config["num_hidden_layers"] = layers
        (folder / "config.json").write_text(json.dumps(config))
        assert main([str(folder), str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"asks for {layers} layers" in err and said in err
    assert no_real_model_built == [] and not (tmp_path / "run").exists()


def test_an_exported_folder_whose_config_asks_for_13b_is_refused_unbuilt(
    tmp_path, no_real_model_built
):
    from arlm.export import export_model, load_exported
    from shared.tokenizer import Tokenizer

    cfg = ModelConfig(vocab_size=258, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64)
    export_model(Transformer(cfg), Tokenizer.byte(), tmp_path / "export")
    config_file = tmp_path / "export" / "config.json"
    config = json.loads(config_file.read_text())
    config |= {"hidden_size": HUGE["dim"], "intermediate_size": HUGE["hidden_dim"]}
    config |= {"num_attention_heads": 40, "num_key_value_heads": 40, "head_dim": 128}
    config_file.write_text(json.dumps(config))
    built = len(no_real_model_built)
    with pytest.raises(ValueError, match="is stored with shape .* but config.json makes it"):
        load_exported(tmp_path / "export")
    assert no_real_model_built[built:] == ["meta"]
