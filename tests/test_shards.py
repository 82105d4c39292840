"""Token shards: written once, memory-mapped, the same rows as the in-memory path, bounded
memory, exact resume, the split over processes, and one-line refusals."""

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.data import corpus as corpus_mod
from shared.data import shard_command
from shared.data.corpus import load_corpus, stream_hub_documents
from shared.data.rows import EpochSampler, tokenize_corpus
from shared.data.shard_writer import write_shards
from shared.data.shards import MANIFEST, ShardRows, open_shards, rank_shards
from shared.errors import ConfigError, ResourceUnavailableError
from shared.tokenizer import Tokenizer
from shared.training import cli

pytestmark = pytest.mark.usefixtures("private_home")

SYNTHETIC = "synthetic:hmm?seed=1&n=2000"


def corpus_pairs(corpus):
    yield from (("train", text) for text in corpus.train)
    yield from (("validation", text) for text in corpus.validation)


@pytest.mark.parametrize("protocol", ["packed", "padded"])
def test_shard_rows_equal_the_in_memory_rows(protocol, tmp_path):
    corpus = load_corpus(SYNTHETIC)
    tokenizer = Tokenizer.byte()
    memory = tokenize_corpus(
        corpus, tokenizer, protocol=protocol, seq_len=16, cache_dir=tmp_path / "cache"
    )
    folder = tmp_path / "shards"
    manifest = write_shards(
        folder,
        corpus_pairs(corpus),
        tokenizer,
        protocol=protocol,
        seq_len=16,
        shard_tokens=15 * 100,
        source=SYNTHETIC,
    )
    assert len(manifest["splits"]["train"]["shards"]) > 5  # rows are read across shard files
    assert manifest["dtype"] == "<u2"
    splits = open_shards(folder, tokenizer, protocol=protocol, seq_len=16)
    every = np.arange(len(splits.train))
    np.testing.assert_array_equal(splits.train[every], memory["train"].tokens)
    np.testing.assert_array_equal(splits.validation[:], memory["validation"].tokens)
    for split in ("train", "validation"):
        assert manifest["splits"][split]["n_bytes"] == memory[split].n_bytes
        assert manifest["splits"][split]["n_loss_tokens"] == memory[split].n_loss_tokens


def synthetic_documents(n_docs: int, seed: int = 0):
    """Documents made one at a time (the corpus is never a list in memory)."""
    rng = np.random.default_rng(seed)
    for i in range(n_docs):
        letters = rng.integers(97, 123, size=int(rng.integers(50, 400)), dtype=np.uint8)
        yield ("validation" if i % 20 == 10 else "train"), letters.tobytes().decode()


def packed_shards(folder: Path, tokenizer, documents: int, shard_rows: int) -> dict:
    """Shards of ``documents`` synthetic documents in packed rows of 64 tokens (63 each)."""
    return write_shards(
        folder,
        synthetic_documents(documents),
        tokenizer,
        protocol="packed",
        seq_len=64,
        shard_tokens=63 * shard_rows,
        source="generated",
    )


def test_a_corpus_larger_than_the_memory_budget_is_written_and_read_within_it(tmp_path):
    budget = 2 * 1024 * 1024  # bytes of Python and numpy allocations, tracemalloc's count
    tokenizer = Tokenizer.byte()
    folder = tmp_path / "big"
    # a small write first, so the modules the writer imports on first use (numpy's and the
    # standard library's) are loaded before counting: the budget is for the data, not the code
    packed_shards(tmp_path / "warm-up", tokenizer, documents=40, shard_rows=10)
    open_shards(tmp_path / "warm-up", tokenizer, protocol="packed", seq_len=64)
    tracemalloc.start()
    try:
        manifest = packed_shards(folder, tokenizer, documents=20_000, shard_rows=2000)
        _, write_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        splits = open_shards(folder, tokenizer, protocol="packed", seq_len=64)
        sampler = EpochSampler(len(splits.train), seed=0)
        checksum = 0
        for step in range(len(splits.train) // 32):  # one epoch, in batches of 32 rows
            rows = splits.train[sampler.indices(step * 32, 32)]
            checksum += int(rows[:, 1].sum())
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n_rows = manifest["splits"]["train"]["n_rows"]
    as_int32 = n_rows * 64 * 4  # what the in-memory path would hold
    on_disk = sum(p.stat().st_size for p in folder.glob("train-*.bin"))
    assert on_disk > 2 * budget and as_int32 > 4 * budget  # the corpus exceeds the budget
    assert write_peak < budget, write_peak
    assert read_peak < budget, read_peak
    assert all(isinstance(m, np.memmap) for m in splits.train.maps)
    assert checksum > 0


def write_kjv_like(folder: Path, tokenizer=None, shard_tokens: int = 31 * 400) -> dict:
    corpus = load_corpus(SYNTHETIC)
    return write_shards(
        folder,
        corpus_pairs(corpus),
        tokenizer or Tokenizer.byte(),
        protocol="packed",
        seq_len=32,
        shard_tokens=shard_tokens,
        source=SYNTHETIC,
    )


def test_bad_shards_are_refused_in_one_line(tmp_path):
    tokenizer = Tokenizer.byte()
    folder = tmp_path / "s"
    manifest = write_kjv_like(folder)
    first = folder / manifest["splits"]["train"]["shards"][0]["file"]
    data = first.read_bytes()

    def refusal() -> str:
        with pytest.raises(ConfigError) as error:
            open_shards(folder, tokenizer, protocol="packed", seq_len=32)
        assert "\n" not in str(error.value)
        return str(error.value)

    first.write_bytes(data[:-2])
    assert "truncated" in refusal()
    first.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    assert "checksum" in refusal()
    first.unlink()
    assert "missing" in refusal()
    first.write_bytes(data)
    open_shards(folder, tokenizer, protocol="packed", seq_len=32)  # whole again
    with pytest.raises(ConfigError, match="another tokenizer"):
        open_shards(folder, Tokenizer.gpt2(), protocol="packed", seq_len=32)
    with pytest.raises(ConfigError, match="seq_len=32 rows"):
        open_shards(folder, tokenizer, protocol="packed", seq_len=64)
    (folder / MANIFEST).unlink()
    assert "no manifest.json" in refusal()
    with pytest.raises(ConfigError, match="no such folder"):
        open_shards(tmp_path / "none", tokenizer, protocol="packed", seq_len=32)


def test_each_process_reads_its_own_shards_and_an_uneven_split_is_refused(tmp_path):
    tokenizer = Tokenizer.byte()
    folder = tmp_path / "s"
    manifest = write_kjv_like(folder)
    shards = manifest["splits"]["train"]["shards"]
    n = len(shards)
    world = next(w for w in (2, 3, 4) if n % w == 0)
    parts = [
        open_shards(folder, tokenizer, protocol="packed", seq_len=32, rank=r, world=world)
        for r in range(world)
    ]
    whole = open_shards(folder, tokenizer, protocol="packed", seq_len=32)
    assert sum(len(p.train) for p in parts) == len(whole.train) == parts[0].total_train_rows
    for rank, part in enumerate(parts):
        names = [Path(m.filename).name for m in part.train.maps]
        assert names == [s["file"] for s in shards[rank::world]]
    uneven = next(w for w in range(2, n + 2) if n % w)
    with pytest.raises(ConfigError, match=f"{uneven} processes cannot split evenly"):
        rank_shards(shards, 0, uneven, folder)


def test_shard_rows_refuse_out_of_range_rows(tmp_path):
    folder = tmp_path / "s"
    write_kjv_like(folder)
    rows = open_shards(folder, Tokenizer.byte(), protocol="packed", seq_len=32).train
    assert isinstance(rows, ShardRows) and rows.shape == (len(rows), 32)
    with pytest.raises(IndexError):
        rows[np.array([len(rows)])]


def shard_train_args(out: Path, folder: Path, *extra: str) -> list[str]:
    return [
        "--preset",
        "tiny",
        "--dataset",
        f"shards:{folder}",
        "--out",
        str(out),
        "--cache-dir",
        str(out.parent / "cache"),
        "--max-steps",
        "12",
        "--eval-every",
        "4",
        "--warmup-steps",
        "2",
        *extra,
    ]


def test_training_on_shards_resumes_on_the_same_tokens(tmp_path, monkeypatch):
    from shared.training.data_order import DataOrder

    folder = tmp_path / "shards"
    write_kjv_like(folder)
    seen: list[torch.Tensor] = []
    rows_of = DataOrder.rows

    def recorded(self, step):
        seen.append(rows_of(self, step))
        return seen[-1]

    monkeypatch.setattr(DataOrder, "rows", recorded)
    straight = cli.train_from_argv(shard_train_args(tmp_path / "straight", folder))
    straight_tokens, seen[:] = list(seen), []
    first = cli.train_from_argv(
        shard_train_args(tmp_path / "split", folder, "--stop-after-steps", "6")
    )
    assert first["step"] == 6 and not first["finished"]
    saved = tmp_path / "split" / "checkpoints" / "step_000006" / "state.json"
    state = json.loads(saved.read_text())
    assert state["data_position"]["samples_per_order"] == 6 * 8  # the tiny preset's 8 rows
    assert state["data_position"]["order"] == "global"
    resumed = cli.train_from_argv(
        ["--resume", str(tmp_path / "split"), "--cache-dir", str(tmp_path / "cache")]
    )
    assert resumed["finished"]
    assert len(seen) == len(straight_tokens) == 12
    for step, (a, b) in enumerate(zip(straight_tokens, seen)):
        assert torch.equal(a, b), step
    assert resumed["val_nats_per_token"] == straight["val_nats_per_token"]
    assert straight["data"]["dataset"] == f"shards:{folder}"


def test_training_refuses_shards_of_another_tokenizer_in_one_line(tmp_path, capsys):
    folder = tmp_path / "shards"
    write_kjv_like(folder)
    status = cli.main(shard_train_args(tmp_path / "run", folder, "--tokenizer", "gpt2"))
    err = capsys.readouterr().err
    assert status == 2 and "written with tokenizer 'byte'" in err and len(err.splitlines()) == 1


def test_a_saved_per_process_order_refuses_another_process_count():
    from shared.training.data_order import DataOrder

    def order_on(processes: int) -> DataOrder:
        class Processes:
            num_processes, process_index = processes, 0

        return DataOrder(
            np.zeros((12, 4)), seed=0, batch_size=6, accelerator=Processes(), sharded=True,
            source="x",
        )  # fmt: skip

    saved = order_on(2).position(3)
    assert saved["order"] == "per-process shards" and saved["processes"] == 2
    order_on(2).check_resume(saved, 3)
    # the same kind of order on another count: only the process count tells them apart
    with pytest.raises(
        ConfigError,
        match="order is per-process shards over 2 processes, this run's is per-process shards "
        "over 3 processes",
    ):
        order_on(3).check_resume(saved, 3)
    with pytest.raises(ConfigError, match="over 2 processes, this run's is global"):
        order_on(1).check_resume(saved, 3)
    order_on(3).check_resume(None, 3)  # a checkpoint from before data positions were saved


def test_streaming_hub_corpus_offline_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResourceUnavailableError, match="offline"):
        list(stream_hub_documents("no-such-user/no-such-dataset"))
    status = shard_command.main(
        ["--data", "no-such-user/no-such-dataset", "--streaming", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert status == 2 and "offline" in err and len(err.splitlines()) == 1


def test_streaming_reads_an_iterable_dataset_once(tmp_path, monkeypatch):
    import datasets

    calls = {}

    def fake_load(name, config=None, **kwargs):
        calls.update(kwargs, name=name)
        return iter({"text": f"document {i} " * 5} for i in range(200))

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(corpus_mod.hub, "hub_unreachable", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    status = shard_command.main(
        ["--data", "some/corpus", "--streaming", "--seq-len", "16", "--out", str(tmp_path / "o")]
    )
    assert status == 0 and calls["streaming"] is True and calls["split"] == "train"
    manifest = json.loads((tmp_path / "o" / MANIFEST).read_text())
    assert manifest["splits"]["validation"]["n_rows"] > 0  # every 20th document held out


def test_shard_data_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    args = ["--data", SYNTHETIC, "--out", str(out), "--seq-len", "16"]
    assert shard_command.main(args) == 0
    assert shard_command.main(args) == 2  # the folder already holds shards
    assert shard_command.main([*args[:3], str(tmp_path / "p"), "--shard-tokens", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "already holds token shards" in err[0] and "shard-tokens" in err[1]


def test_ctrl_c_during_shard_data_removes_what_it_wrote(tmp_path, capsys, monkeypatch):
    # Ctrl-C after every shard and the manifest were written, before the folder's marker: one
    # line, the shell's status for SIGINT, and nothing of the shards left to be read or refused
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shard_command, "mark_folder", interrupted)
    out = tmp_path / "o"
    args = ["--data", SYNTHETIC, "--out", str(out), "--seq-len", "16", "--shard-tokens", "64"]
    assert shard_command.main(args) == 130
    assert capsys.readouterr().err.splitlines() == ["error: stopped by Ctrl-C (SIGINT)"]
    assert not out.exists()  # the folder it made goes too
    monkeypatch.undo()
    assert shard_command.main(args) == 0  # the rerun writes them whole


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.multiprocess
def test_two_processes_read_their_own_shards_and_resume_only_on_two(tmp_path):
    import shutil
    import subprocess
    import sys

    from launch import free_port, two_cpu_processes

    if shutil.which("accelerate") is None:
        pytest.skip("accelerate launcher not on PATH")
    root = Path(__file__).resolve().parent.parent
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}

    def run(*args: str, launcher: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*launcher, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
        )

    two = [*two_cpu_processes(port=free_port()), "train.py"]
    one = [sys.executable, "train.py"]
    folder = tmp_path / "shards"
    manifest = write_kjv_like(folder, shard_tokens=31 * 130)
    assert len(manifest["splits"]["train"]["shards"]) % 2 == 0
    common = ["--max-steps", "6", "--eval-every", "100", "--log-every", "1"]
    straight = run(*shard_train_args(tmp_path / "straight", folder, *common), launcher=two)
    assert straight.returncode == 0, straight.stderr[-3000:]
    split = tmp_path / "split"
    first = run(*shard_train_args(split, folder, *common, "--stop-after-steps", "3"), launcher=two)
    assert first.returncode == 0, first.stderr[-3000:]
    state = json.loads((split / "checkpoints" / "step_000003" / "state.json").read_text())
    assert state["data_position"]["order"] == "per-process shards"
    assert state["data_position"]["processes"] == 2
    refused = run("--resume", str(split), "--cache-dir", str(tmp_path / "cache"), launcher=one)
    assert refused.returncode == 2
    assert "per-process shards over 2 processes" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    resumed = run("--resume", str(split), "--cache-dir", str(tmp_path / "cache"), launcher=two)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def losses(out: Path) -> list[float]:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]

    assert losses(straight_out := tmp_path / "straight") == losses(split)
    assert len(losses(straight_out)) == 6

    # A shard only the second process reads fails its checksum: both stop, with its line.
    second = folder / manifest["splits"]["train"]["shards"][1]["file"]
    data = second.read_bytes()
    second.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    broken = run(*shard_train_args(tmp_path / "broken", folder, *common), launcher=two)
    assert broken.returncode != 0
    assert f"shard {second} fails its checksum" in broken.stderr


def test_a_text_reader_names_shards_as_no_text_corpus():
    with pytest.raises(ValueError, match="holds token shards, not text.*'source'"):
        load_corpus("shards:/some/folder")
