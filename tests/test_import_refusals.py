"""``duolm import`` of a malformed folder is one line, Ctrl-C leaves nothing behind, a duolm run
folder is named as one, a folder is never imported into itself, and the row length an export
recorded is the one the import uses."""

import json
import shutil
from pathlib import Path

import pytest
from test_import import save_hf, tiny_hf_model

from shared.checkpoint import read_state, resolve_checkpoint
from shared.formats import importer
from shared.training.run_folder import mark_folder

pytest.importorskip("transformers")

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_mdm_run"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    return save_hf(tiny_hf_model("llama"), tmp_path_factory.mktemp("source") / "hf")


def copy_of_hf_folder(hf_folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(hf_folder, tmp_path / "hf"))


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def status_of(argv: list[str]) -> int:
    """``duolm import argv``'s exit status; a KeyboardInterrupt escaping it is a failure here, not
    the end of the test session."""
    try:
        return importer.main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped duolm import")


@pytest.mark.parametrize("text", ["", "garbage", "{}"])
def test_an_unreadable_tokenizer_json_is_one_line(hf_folder, tmp_path, capsys, text):
    folder = copy_of_hf_folder(hf_folder, tmp_path)
    (folder / "tokenizer.json").write_text(text)
    assert status_of([str(folder), str(tmp_path / "run")]) == 2
    line = error_line(capsys)
    assert "tokenizer.json: not a tokenizer" in line and "save_pretrained" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("hidden_size", None, "config.json has no 'hidden_size'"),
        ("num_attention_heads", "two", "num_attention_heads='two' must be a positive integer"),
        ("rms_norm_eps", "small", "rms_norm_eps='small' must be a number"),
    ],
)
def test_a_config_missing_a_field_or_holding_a_wrong_type_is_one_line(
    hf_folder, tmp_path, capsys, field, value, said
):
    folder = copy_of_hf_folder(hf_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    if value is None:
        del config[field]
    else:
        config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    assert status_of([str(folder), str(tmp_path / "run")]) == 2
    assert said in error_line(capsys)


def test_ctrl_c_while_writing_leaves_nothing_and_the_same_command_then_imports(
    hf_folder, tmp_path, monkeypatch, capsys
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "new" / "run"
    with monkeypatch.context() as patch:
        patch.setattr(importer, "write_safetensors", interrupted)
        assert status_of([str(hf_folder), str(out)]) == 130
    line = error_line(capsys)
    assert "stopped by Ctrl-C" in line and "nothing of it was left" in line
    assert not (tmp_path / "new").exists()
    assert status_of([str(hf_folder), str(out)]) == 0


def test_a_folder_left_by_an_unfinished_import_is_not_called_a_training_run(
    hf_folder, tmp_path, capsys
):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    mark_folder(tmp_path / "run", "import")
    assert status_of([str(hf_folder), str(tmp_path / "run")]) == 2
    line = error_line(capsys)
    assert "stopped before it finished" in line and "training run" not in line


def test_a_duolm_run_folder_is_named_as_one_not_sent_to_convert_bin_files(tmp_path, capsys):
    assert status_of([str(FIXTURE), str(tmp_path / "run")]) == 2
    line = error_line(capsys)
    assert "is a duolm run folder" in line and ".bin" not in line


def test_a_folder_is_never_imported_into_itself(hf_folder, tmp_path, capsys):
    folder = copy_of_hf_folder(hf_folder, tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    assert status_of([str(folder), str(folder), "--overwrite"]) == 2
    assert "holds the source" in error_line(capsys)
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not list(tmp_path.glob("hf.replaced-*"))


def test_the_row_length_an_export_recorded_is_the_one_imported(hf_folder, tmp_path):
    folder = copy_of_hf_folder(hf_folder, tmp_path)
    (folder / "duolm_export.json").write_text(json.dumps({"seq_len": 16}))
    assert status_of([str(folder), str(tmp_path / "run")]) == 0
    state = read_state(resolve_checkpoint(tmp_path / "run"))
    assert state["train_config"]["seq_len"] == 16  # not the model's 64-token context
    assert status_of([str(folder), str(tmp_path / "asked"), "--seq-len", "8"]) == 0
    assert read_state(resolve_checkpoint(tmp_path / "asked"))["train_config"]["seq_len"] == 8
