"""Reads stay inside the folder given, and what a received folder holds is checked before use.

A checkpoint holds no symbolic link (in it, as it, or as its run's checkpoints folder); an
import reads no shard or file outside its source folder; a received JSON file nested too deep,
or not JSON at all, is one line naming it; a training state out of range is refused before the
run writes anything; a run's recorded cache folder never chooses where caches go; and every
sampling and evaluation seed is checked by one argparse type. Every "outside" file here is a
file in the test's own temporary folder."""

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers import copy_of, relist

from shared import checkpoint as ckpt
from shared.cli_args import seed_argument
from shared.door import read_json_file
from shared.errors import CheckpointError, ConfigError
from shared.formats import importer
from shared.formats.reader import check_folder_files, read_folder, shard_files
from shared.training import cli, resume_run
from shared.training.config import DEFAULT_CACHE
from shared.training.resume import resumed_config

STEP = "step_000002"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(autouse=True)
def home_in_tmp(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


def edit_record(checkpoint: Path, name: str, change) -> None:
    """Change one JSON record of ``checkpoint`` and list it again."""
    record = json.loads((checkpoint / name).read_text())
    change(record)
    (checkpoint / name).write_text(json.dumps(record))
    relist(checkpoint)


def resume_status(run: Path, cache_dir: Path, capsys) -> tuple[int, str]:
    """(exit status, last stderr line) of ``train.py --resume run --max-steps 40``."""
    argv = ["--resume", str(run), "--max-steps", "40", "--cache-dir", str(cache_dir)]
    status = cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    return status, lines[-1] if lines else ""


def config_steps(run: Path) -> int:
    return json.loads((run / "config.json").read_text())["train_config"]["max_steps"]


# ---------------------------------------------------------------- links in checkpoints


def test_a_checkpoint_file_that_links_elsewhere_is_refused_naming_it(
    tiny_run, cache_dir, tmp_path, capsys
):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    outside = tmp_path / "outside.json"
    shutil.move(checkpoint / "rng.json", outside)  # the same bytes, so the checksum matches
    os.symlink(outside, checkpoint / "rng.json")
    status, line = resume_status(run, cache_dir, capsys)
    assert status == 2
    assert f"{checkpoint / 'rng.json'} is a symbolic link (to {outside})" in line
    assert config_steps(run) == 2  # nothing was written
    with pytest.raises(ConfigError, match="symbolic link"):
        ckpt.load_model_from_checkpoint(run)  # sampling and evaluation refuse it too


def test_a_link_deeper_in_a_checkpoint_is_refused(tiny_run, tmp_path):
    run = copy_of(tiny_run, tmp_path)
    tokenizer = run / "checkpoints" / STEP / "tokenizer"
    meta = next(tokenizer.iterdir())
    outside = tmp_path / "meta.json"
    shutil.move(meta, outside)
    os.symlink(outside, meta)
    with pytest.raises(ConfigError, match=f"{meta} is a symbolic link"):
        ckpt.resolve_checkpoint(run)


def test_a_checkpoint_folder_that_links_outside_the_run_is_refused(
    tiny_run, cache_dir, tmp_path, capsys
):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    elsewhere = tmp_path / "elsewhere" / STEP
    elsewhere.parent.mkdir()
    shutil.move(checkpoint, elsewhere)
    os.symlink(elsewhere, checkpoint)
    status, line = resume_status(run, cache_dir, capsys)
    assert status == 2
    assert f"{checkpoint} is a symbolic link (to {elsewhere})" in line
    assert config_steps(run) == 2
    with pytest.raises(ConfigError, match="symbolic link"):
        resume_run(checkpoint)  # named directly, too


def test_a_checkpoints_folder_that_links_outside_the_run_is_refused(tiny_run, tmp_path):
    run = copy_of(tiny_run, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "checkpoints", elsewhere)
    os.symlink(elsewhere, run / "checkpoints")
    with pytest.raises(ConfigError, match=f"{run / 'checkpoints'} is a symbolic link"):
        resume_run(run)
    with pytest.raises(ConfigError, match="symbolic link"):
        ckpt.verify_checkpoint(run / "checkpoints" / STEP)


def test_a_fifo_in_a_checkpoint_is_refused_without_opening_it(tiny_run, tmp_path):
    run = copy_of(tiny_run, tmp_path)
    os.mkfifo(run / "checkpoints" / STEP / "extra")  # opening it would block
    with pytest.raises(ConfigError, match="not a regular file"):
        resume_run(run)


def test_manifest_names_that_leave_the_checkpoint_are_still_refused(tiny_run, tmp_path):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    manifest = json.loads((checkpoint / ckpt.MANIFEST).read_text())
    (checkpoint / ckpt.MANIFEST).write_text(json.dumps({**manifest, "../x": "0" * 64}))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        ckpt.read_manifest(checkpoint)


# ---------------------------------------------------------------- malformed training state


def set_python_word(record):
    record["python"]["state"][0] = 10**30


def set_numpy_position(record):
    record["numpy"]["pos"] = -1


def set_nan_rate(record):
    record["param_groups"][0]["lr"] = math.nan


def set_infinite_eps(record):
    record["param_groups"][1]["eps"] = math.inf


def set_huge_scheduler_step(record):
    record["scheduler"]["last_epoch"] = 10**30


def set_beta_of_one(record):
    record["param_groups"][0]["betas"] = [0.9, 1.0]


def set_text_step(record):
    record["step"] = "2"


def set_negative_step(record):
    record["step"] = -5


def set_other_step(record):
    record["step"] = 7


@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("rng.json", set_python_word, "python.state[0] is an integer of 31 digits"),
        ("rng.json", set_numpy_position, "numpy.pos is -1"),
        ("optimizer.json", set_nan_rate, "param_groups[0].lr is nan"),
        ("optimizer.json", set_infinite_eps, "param_groups[1].eps is inf"),
        ("optimizer.json", set_huge_scheduler_step, "scheduler.last_epoch is an integer of 31"),
        ("optimizer.json", set_beta_of_one, "param_groups[0].betas is [0.9, 1.0]"),
        ("state.json", set_text_step, "step is '2'"),
        ("state.json", set_negative_step, "step is -5"),
        ("state.json", set_other_step, f"step is 7, but the checkpoint's folder is {STEP}"),
    ],
)
def test_a_malformed_training_state_is_refused_before_the_run_writes(
    tiny_run, cache_dir, tmp_path, capsys, name, change, said
):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    edit_record(checkpoint, name, change)
    before = (run / "metrics.jsonl").read_text()
    status, line = resume_status(run, cache_dir, capsys)
    assert status == 2
    assert line.startswith(f"error: {checkpoint / name}: ")
    assert said in line
    assert config_steps(run) == 2  # config.json still says what the run trained
    assert (run / "metrics.jsonl").read_text() == before


def test_a_deeply_nested_state_is_one_line(tiny_run, cache_dir, tmp_path, capsys):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    (checkpoint / "state.json").write_text(DEEP)
    relist(checkpoint)
    status, line = resume_status(run, cache_dir, capsys)
    assert status == 2
    said = "JSON nested too deeply to read (damaged or crafted)"
    assert line == f"error: {checkpoint / 'state.json'}: {said}"


def test_a_deeply_nested_manifest_makes_the_checkpoint_invalid(tiny_run, tmp_path):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    (checkpoint / ckpt.MANIFEST).write_text(DEEP)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        ckpt.verify_checkpoint(checkpoint)


# ---------------------------------------------------------------- received JSON


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (DEEP, "nested too deeply"),
        ("{not json", "not JSON (Expecting property name"),
        ("1" * 5000, "an integer of 5000 digits"),
        (b"\xff\xfe{}", "not JSON (not UTF-8 text"),
    ],
)
def test_the_received_json_reader_names_the_file_in_one_line(tmp_path, text, said):
    path = tmp_path / "received.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as refused:
        read_json_file(path)
    assert str(refused.value).startswith(f"{path}: ")
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_deep_findings_index_is_one_line(tmp_path, capsys):
    from eval.findings import __main__ as findings

    index = tmp_path / "index.json"
    index.write_text(DEEP)
    assert findings.main(["--table", str(index), str(tmp_path)]) == 2
    assert "nested too deeply" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_deep_metrics_file_is_one_line(tmp_path):
    from shared.training.metrics import metric_records

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n' + DEEP + "\n")
    with pytest.raises(ConfigError, match=f"{metrics} line 2: JSON nested too deeply"):
        metric_records(metrics)


# ---------------------------------------------------------------- imports


def model_folder(tmp_path: Path) -> Path:
    """A model folder with a config.json; the tests add what they need to it."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def write_index(folder: Path, shard: str) -> None:
    index = {"weight_map": {"model.embed_tokens.weight": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("kind", ["climbs", "absolute", "link"])
def test_an_import_refuses_a_shard_outside_its_folder(tmp_path, capsys, kind):
    folder = model_folder(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.safetensors").write_bytes(b"not opened")
    if kind == "link":
        os.symlink(other / "x.safetensors", folder / "x.safetensors")
        name = "x.safetensors"
    else:
        name = "../other/x.safetensors" if kind == "climbs" else str(other / "x.safetensors")
    write_index(folder, name)
    with pytest.raises(ConfigError, match="lies outside") as refused:
        shard_files(folder)
    assert str(folder) in str(refused.value)
    assert importer.main([str(folder), str(tmp_path / "out")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "lies outside" in line and "an import reads only files inside its own folder" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_an_import_refuses_a_folder_file_that_links_outside(tmp_path, name):
    folder = model_folder(tmp_path)
    outside = tmp_path / "outside"
    outside.write_text("{}")
    (folder / name).unlink(missing_ok=True)
    os.symlink(outside, folder / name)
    with pytest.raises(ConfigError, match=f"{folder / name} \\(a symbolic link to {outside}\\)"):
        read_folder(folder)


def test_a_hub_cache_snapshot_may_link_to_its_blobs(tmp_path):
    repository = tmp_path / "models--owner--name"
    snapshot = repository / "snapshots" / "abc123"
    (repository / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repository / "blobs" / "1111").write_text(json.dumps({"model_type": "llama"}))
    (repository / "blobs" / "2222").write_bytes(b"weights")
    os.symlink("../../blobs/1111", snapshot / "config.json")
    os.symlink("../../blobs/2222", snapshot / "model.safetensors")
    check_folder_files(snapshot)
    assert shard_files(snapshot) == [snapshot / "model.safetensors"]


def test_an_import_of_a_hub_cache_snapshot_reads_the_blobs_its_links_name(tmp_path, cache_dir):
    """A hub download is a snapshot of links into ``../../blobs``: the import reads the blob
    each link names (the door opens no link) and gets the weights of the same folder as files."""
    from arlm.export import export_checkpoint

    run = tmp_path / "ar"
    flags = ["--preset", "tiny", "--cache-dir", str(cache_dir), "--max-steps", "1"]
    cli.train_from_argv([*flags, "--out", str(run)])
    export_checkpoint(run, tmp_path / "exported")
    repository = tmp_path / "hub" / "models--owner--tiny"
    snapshot = repository / "snapshots" / "abc123"
    (repository / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, file in enumerate(sorted((tmp_path / "exported").iterdir())):
        if file.is_file():
            shutil.copyfile(file, repository / "blobs" / f"{number:04d}")
            os.symlink(f"../../blobs/{number:04d}", snapshot / file.name)
    importer.main([str(tmp_path / "exported"), str(tmp_path / "from-files")])
    assert importer.main([str(snapshot), str(tmp_path / "from-snapshot")]) == 0
    weights = [
        (ckpt.resolve_checkpoint(tmp_path / name) / "model.safetensors").read_bytes()
        for name in ("from-files", "from-snapshot")
    ]
    assert weights[0] == weights[1]


def test_a_deep_import_index_is_one_line(tmp_path):
    folder = model_folder(tmp_path)
    (folder / "model.safetensors.index.json").write_text(DEEP)
    with pytest.raises(ConfigError, match="nested too deeply"):
        shard_files(folder)


# ---------------------------------------------------------------- cache folders


def with_cache_dir(tiny_run: Path, tmp_path: Path, where: Path) -> Path:
    """A copy of the run whose records name ``where`` as their cache folder."""
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    edit_record(checkpoint, "state.json", lambda s: s["train_config"].update(cache_dir=str(where)))
    return run


class Stop(Exception):
    pass


def caught_cache(monkeypatch, module) -> list[Path]:
    """Record the cache folder ``module`` tokenizes into, and stop there."""
    seen: list[Path] = []

    def tokenize_corpus(*args, cache_dir, **kwargs):
        seen.append(Path(cache_dir))
        raise Stop

    monkeypatch.setattr(module, "tokenize_corpus", tokenize_corpus)
    return seen


def test_likelihood_distill_and_stages_never_cache_where_the_run_says(
    tiny_run, tmp_path, monkeypatch
):
    from dllm.uniform import distill
    from eval import likelihood
    from eval.experiments import stages
    from shared.files import cache_root

    chosen = tmp_path / "chosen-by-the-run"
    run = with_cache_dir(tiny_run, tmp_path, chosen)
    state = ckpt.read_state(run / "checkpoints" / STEP)
    _, tokenizer, _ = ckpt.load_model_from_checkpoint(run)
    for module, call, typed in (
        (likelihood, lambda: likelihood.evaluate_checkpoint(run, max_rows=1), None),
        (distill, lambda: distill.training_rows(state, tokenizer, None), None),
        (distill, lambda: distill.training_rows(state, tokenizer, str(tmp_path / "typed")), 1),
        (stages, lambda: stages.validation_rows(state, tokenizer), None),
    ):
        seen = caught_cache(monkeypatch, module)
        with pytest.raises(Stop):
            call()
        assert seen == [tmp_path / "typed" if typed else cache_root()]
    assert not chosen.exists()


def test_a_resume_caches_where_this_command_says(tiny_run, tmp_path):
    run = with_cache_dir(tiny_run, tmp_path, tmp_path / "chosen-by-the-run")
    saved = ckpt.read_state(run / "checkpoints" / STEP)
    assert resumed_config(saved, {}, False)[1].cache_dir == str(DEFAULT_CACHE)
    typed = str(tmp_path / "typed")
    assert resumed_config(saved, {"cache_dir": typed}, False)[1].cache_dir == typed


# ---------------------------------------------------------------- seeds


def test_the_seed_type_takes_0_to_2_to_the_63_minus_1():
    assert seed_argument("0") == 0
    assert seed_argument(str(2**63 - 1)) == 2**63 - 1
    for text in ("-1", str(2**63), str(2**64 + 1), "9" * 5000, "1.5", "abc", ""):
        with pytest.raises(Exception, match="seed") as refused:
            seed_argument(text)
        assert len(str(refused.value)) < 120


def seed_commands(tmp_path: Path):
    from arlm import sample as ar_sample
    from dllm import sample as diffusion_sample
    from dllm.uniform import distill
    from eval import likelihood
    from eval.experiments import side_by_side

    run = str(tmp_path / "run")
    return {
        "sample (ar)": lambda seed: ar_sample.main([run, "--prompt", "a", "--seed", seed]),
        "sample (diffusion)": lambda seed: diffusion_sample.main([run, "--seed", seed]),
        "likelihood": lambda seed: likelihood.main([run, "--seed", seed]),
        "side-by-side": lambda seed: side_by_side.main([run, run, "--seed", seed]),
        "distill": lambda seed: distill.main([run, str(tmp_path / "out"), "--seed", seed]),
    }


@pytest.mark.parametrize("seed", ["-1", str(2**64 + 1)])
def test_every_sampling_and_evaluation_seed_flag_refuses_out_of_range(tmp_path, capsys, seed):
    for name, command in seed_commands(tmp_path).items():
        with pytest.raises(SystemExit) as exited:
            command(seed)
        assert exited.value.code == 2, name
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "argument --seed:" in line, name
        assert "2**63 - 1" in line, name


def test_the_bench_seed_flag_refuses_out_of_range(monkeypatch, capsys):
    from bench import threshold_reveals

    monkeypatch.setattr(sys, "argv", ["threshold_reveals", "--seed", str(2**64)])
    with pytest.raises(SystemExit) as exited:
        threshold_reveals.main()
    assert exited.value.code == 2
    assert "argument --seed:" in capsys.readouterr().err


def test_a_record_cut_short_by_a_kill_is_dropped_and_the_run_resumes(
    tiny_run, tmp_path, cache_dir, capsys
):
    from shared.training.metrics import metric_records

    run = copy_of(tiny_run, tmp_path)
    metrics = run / "metrics.jsonl"
    whole = metric_records(metrics)
    with metrics.open("a") as handle:
        handle.write('{"step": 99, "kind": "tra')  # kill -9 in the middle of an append
    assert metric_records(metrics) == whole  # the torn tail is left out, not an error
    status, line = resume_status(run, cache_dir, capsys)
    assert status == 0, line
    assert all(record.get("step", 0) <= 40 for _, record in metric_records(metrics))
    assert metrics.read_text().endswith("\n")  # rewritten without the torn record
    # a damaged line that is not the unfinished last one is still one line naming it
    metrics.write_text('{"step": 1, "kin\n{"step": 2}\n')
    with pytest.raises(ConfigError, match="line 1"):
        metric_records(metrics)
