"""Resuming from a checkpoint never runs code from it. The training state is safetensors and
JSON; the pickles of earlier releases are refused on resume (with the command that converts
them), and converted only when the user says they trust them, through the restricted unpickler.
No reader in the project unpickles what a user may receive."""

import ast
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from helpers import copy_of, relist
from safetensors.torch import load_file

from shared import checkpoint as ckpt
from shared.training import cli, convert, resume_run, train
from shared.training_state import read_optimizer_state, read_rng_state

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_mdm_run"
STEP = "step_000002"


class CreatesFile:
    """Unpickling this creates ``path``: what a crafted checkpoint carries instead of a state."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def as_earlier_release(checkpoint: Path, rng=None, optimizer=None) -> None:
    """Give ``checkpoint`` the layout of an earlier release: its training state as the pickles
    ``optimizer.pt`` and ``rng.pt`` (its own state, unless other objects are given)."""
    optimizer_state, scheduler_state = read_optimizer_state(checkpoint)
    own = {"optimizer": optimizer_state, "scheduler": scheduler_state}
    torch.save(own if optimizer is None else optimizer, checkpoint / "optimizer.pt")
    torch.save(read_rng_state(checkpoint) if rng is None else rng, checkpoint / "rng.pt")
    relist(checkpoint, removed=("optimizer.safetensors", "optimizer.json", "rng.json"))


def newest_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.list_checkpoints(run / "checkpoints")[-1] / "model.safetensors"))


def test_the_payload_runs_when_unpickled(tmp_path):
    # what the tests below guard against is real: plain unpickling creates the file
    pickle.loads(pickle.dumps(CreatesFile(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


def test_a_checkpoint_holds_no_pickle(tiny_run):
    checkpoint = tiny_run / "checkpoints" / STEP
    listed = set(ckpt.read_manifest(checkpoint))
    assert {"optimizer.safetensors", "optimizer.json", "rng.json"} <= listed
    assert not any(name.endswith((".pt", ".pkl", ".bin")) for name in listed)


@pytest.mark.parametrize("pickled", ["rng.pt", "optimizer.pt"])
def test_resume_refuses_a_pickled_state_and_runs_nothing_from_it(
    pickled, tiny_run, cache_dir, tmp_path, capsys
):
    run = copy_of(tiny_run, tmp_path)
    checkpoint = run / "checkpoints" / STEP
    target = tmp_path / "created-by-the-checkpoint"
    payload = {pickled.removesuffix(".pt"): CreatesFile(target)}
    as_earlier_release(checkpoint, **payload)
    ckpt.verify_checkpoint(checkpoint)  # the manifest is consistent: only the format is at fault

    argv = ["--resume", str(run), "--cache-dir", str(cache_dir), "--max-steps", "3"]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith("error: ")
    assert pickled in error and f"duolm convert-checkpoint {checkpoint} --trust" in error
    assert not target.exists()

    # Converting without --trust says what converting does and reads nothing; with --trust the
    # restricted unpickler refuses the payload, naming the file and what it asked for.
    assert convert.main([str(run)]) == 2
    assert "--trust" in capsys.readouterr().err
    assert convert.main([str(checkpoint), "--trust"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(checkpoint / pickled) in error
    assert f"asks for {open.__module__}.open" in error  # io.open: what the payload calls
    assert not target.exists()
    assert "rng.pt" in ckpt.read_manifest(checkpoint)  # left as it was
    ckpt.verify_checkpoint(checkpoint)


def test_a_converted_checkpoint_resumes_exactly_as_the_original(tiny_run, cache_dir, tmp_path):
    original, converted = tmp_path / "original", tmp_path / "converted"
    shutil.copytree(tiny_run, original, ignore=shutil.ignore_patterns(".lock"))
    shutil.copytree(tiny_run, converted, ignore=shutil.ignore_patterns(".lock"))
    as_earlier_release(converted / "checkpoints" / STEP)
    assert convert.main([str(converted), "--trust"]) == 0
    listed = ckpt.read_manifest(converted / "checkpoints" / STEP)
    assert set(listed) == set(ckpt.read_manifest(original / "checkpoints" / STEP))
    assert not list((converted / "checkpoints" / STEP).glob("*.pt"))
    for run in (original, converted):
        train(resume_run(run, max_steps=3, cache_dir=str(cache_dir)))
    a, b = newest_weights(original), newest_weights(converted)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert convert.convert(converted, log=lambda _: None) == 0  # nothing left to convert


def test_the_compat_fixture_converts_to_the_values_its_pickles_hold(tmp_path, capsys):
    checkpoint = FIXTURE / "checkpoints" / "step_000012"
    with pytest.raises(ckpt.CheckpointError, match="duolm convert-checkpoint .* --trust"):
        resume_run(FIXTURE)
    pickled_optimizer = convert.read_pickled(checkpoint / "optimizer.pt")
    pickled_rng = convert.read_pickled(checkpoint / "rng.pt")

    run = Path(shutil.copytree(FIXTURE, tmp_path / "run"))
    assert convert.main([str(run), "--trust"]) == 0
    assert "converted" in capsys.readouterr().out
    optimizer, scheduler = read_optimizer_state(run / "checkpoints" / "step_000012")
    assert scheduler == pickled_optimizer["scheduler"]
    assert json.dumps(optimizer["param_groups"]) == json.dumps(
        pickled_optimizer["optimizer"]["param_groups"]
    )
    saved = pickled_optimizer["optimizer"]["state"]
    assert optimizer["state"].keys() == saved.keys()
    for name, entries in saved.items():
        assert entries.keys() == optimizer["state"][name].keys()
        assert all(torch.equal(entries[k], optimizer["state"][name][k]) for k in entries)
    rng = read_rng_state(run / "checkpoints" / "step_000012")
    assert torch.equal(rng["torch"], pickled_rng["torch"])
    assert rng["python"] == pickled_rng["python"]
    name, key, *rest = rng["numpy"]
    assert (name, key.tolist(), rest) == (
        pickled_rng["numpy"][0],
        pickled_rng["numpy"][1].tolist(),
        list(pickled_rng["numpy"][2:]),
    )


# ---------------------------------------------------------------- no unsafe reader left

PROJECT = [
    ROOT / "train.py",
    *(p for d in ("shared", "arlm", "dllm", "eval", "bench") for p in (ROOT / d).rglob("*.py")),
]


# calls that unpickle whatever they are given
UNPICKLERS = ("pickle.load", "pickle.loads", "Unpickler", "marshal.loads", "shelve.open")
UNPICKLERS += ("dill.load", "dill.loads", "joblib.load")


def calls(path: Path) -> list[tuple[str, ast.Call]]:
    """(what is called, as written; the call) for every call in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(ast.unparse(node.func), node) for node in ast.walk(tree) if isinstance(node, ast.Call)]


def keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


# restricted unpicklers, each with a test that a pickle asking for anything else runs nothing:
# torch's own weights-only unpickler over DCP's pickled index of an earlier version's sharded
# checkpoint, read only by convert-checkpoint --trust
# (tests/test_sharded_checkpoints.py::test_an_index_that_unpickles_anything_else_...,
# tests/test_sharded_index.py)
RESTRICTED = {("shared/training/convert.py", "_weights_only_unpickler.Unpickler")}


def test_no_reader_in_the_project_unpickles_freely():
    unsafe = []
    for path in PROJECT:
        for name, call in calls(path):
            where = f"{path.relative_to(ROOT)}:{call.lineno} {name}"
            if (str(path.relative_to(ROOT)), name) in RESTRICTED:
                continue
            if name.endswith(UNPICKLERS):
                unsafe.append(where)
            elif name == "torch.load" and keyword(call, "weights_only") is not True:
                unsafe.append(where)
            elif name == "np.load" and keyword(call, "allow_pickle") is not False:
                unsafe.append(where)
            elif keyword(call, "trust_remote_code") is True:
                unsafe.append(where)
    assert not unsafe, "\n".join(unsafe)
