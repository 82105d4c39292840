"""Two throughput runs compared (eval/speed/throughput_runs.py): the within-spread test, the ratios
and the verdict rule on constructed measurements; runs that measured different things (another
preset, model shape, length, sampler settings or threads) and files that are not measurements are
refused with one line, exit status 2."""

import json
import os

import pytest

from eval.speed.throughput import Record, Spread, Throughput, merge_runs
from eval.speed.throughput_runs import (
    HOST_CHANGED,
    NO_PROBES,
    NO_RATIO_INTERVAL,
    NOT_REPRODUCED,
    RATIOS_NOT_REPRODUCED,
    RATIOS_REPRODUCED,
    RATIOS_WITHIN_CHANCE,
    REPRODUCED,
    compare_runs,
    main,
)
from shared.errors import ConfigError


def record(name: str, batch: int, median: float, low: float, high: float) -> Record:
    return Record(
        name=name,
        batch_size=batch,
        rounds=3,
        warmup=1,
        tokens_per_s=Spread(median, low, high),
        seconds_per_sample=Spread(1.0, 1.0, 1.0),
        round_seconds=[1.0, 1.0, 1.0],
        round_tokens=[1, 1, 1],
        positions=[0, 1, 2],
    )


def run(settings: list[Record], probes: list[Record] = ()) -> Throughput:
    return Throughput(list(settings), {"cpu": "test"}, [], list(probes))


def test_a_run_inside_the_others_spread_reproduces():
    first = run([record("ar", 1, 100, 90, 110), record("mdm", 1, 50, 45, 55)])
    second = run([record("ar", 1, 105, 95, 115), record("mdm", 1, 48, 44, 52)])
    (batch,) = compare_runs(first, second)
    assert batch.verdict == REPRODUCED
    assert [p.ratio for p in batch.settings] == [1.05, 0.96]
    assert batch.ratio_spread() == Spread(pytest.approx(1.005), 0.96, 1.05)


def test_within_means_both_medians_inside_both_spreads():
    # The second median lies inside the first's spread, but the first's lies outside the
    # second's (a narrow second run): not within.
    first = run([record("ar", 1, 100, 80, 120)])
    second = run([record("ar", 1, 110, 108, 112)])
    (batch,) = compare_runs(first, second)
    assert not batch.settings[0].within and batch.verdict == NO_PROBES


def test_the_probes_tell_the_host_from_the_measurement():
    slow = [record("ar", 1, 100, 95, 105)], [record("ar", 1, 70, 65, 75)]
    steady_probe = [record("probe", 1, 1000, 990, 1010)], [record("probe", 1, 1002, 995, 1008)]
    moved_probe = [record("probe", 1, 1000, 990, 1010)], [record("probe", 1, 700, 690, 710)]
    (batch,) = compare_runs(run(slow[0], moved_probe[0]), run(slow[1], moved_probe[1]))
    assert batch.verdict == HOST_CHANGED and batch.probes[0].ratio == 0.7
    (batch,) = compare_runs(run(slow[0], steady_probe[0]), run(slow[1], steady_probe[1]))
    assert batch.verdict == NOT_REPRODUCED
    # A probe that moved the other way (the host got faster, the settings slower) does not
    # explain the settings.
    faster_probe = [record("probe", 1, 1000, 990, 1010)], [record("probe", 1, 1300, 1290, 1310)]
    (batch,) = compare_runs(run(slow[0], faster_probe[0]), run(slow[1], faster_probe[1]))
    assert batch.verdict == NOT_REPRODUCED
    # A host that moved does not spoil runs whose settings still agree.
    same = [record("ar", 1, 100, 95, 105)]
    (batch,) = compare_runs(run(same, moved_probe[0]), run(same, moved_probe[1]))
    assert batch.verdict == REPRODUCED


def test_batches_and_settings_measured_by_one_run_only_are_left_out():
    first = run([record("ar", 1, 100, 90, 110), record("ar", 32, 900, 850, 950)])
    second = run([record("ar", 1, 100, 90, 110), record("mdm", 1, 10, 9, 11)])
    (batch,) = compare_runs(first, second)
    assert batch.batch_size == 1 and [p.name for p in batch.settings] == ["ar"]
    with pytest.raises(ValueError, match="share no setting"):
        compare_runs(run([record("ar", 1, 1, 1, 1)]), run([record("mdm", 1, 1, 1, 1)]))


def test_the_command_reads_stored_stages_and_refuses_other_files(tmp_path, capsys):
    probe = [record("probe", 1, 1000, 990, 1010)]
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps({"result": run([record("ar", 1, 100, 95, 105)], probe).as_dict()}))
    b.write_text(json.dumps(run([record("ar", 1, 70, 65, 75)], probe).as_dict()))
    assert main([str(a), str(b), "--json", str(tmp_path / "s.json")]) == 0
    text = capsys.readouterr().out
    assert "### Batch 1: not reproduced" in text and "| ar | 100 [95, 105] | 70 [65, 75] |" in text
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary[0]["verdict"] == NOT_REPRODUCED and summary[0]["probe_ratios"] == {"probe": 1.0}
    (tmp_path / "bad.json").write_text('{"rows": []}')
    assert main([str(a), str(tmp_path / "bad.json")]) == 2
    assert "no 'records'" in error_line(capsys)
    assert main([str(a), str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in error_line(capsys)


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---- runs that did not measure the same thing, and files that are not measurements -------------


def setup(**changes) -> dict:
    """A recorded setup as the comparison's throughput stage writes it (demo-like)."""
    shape = {"objective": "ar", "dim": 256, "n_layers": 4, "n_heads": 4, "max_seq_len": 256}
    base = {
        "preset": "demo",
        "models": {"ar": shape, "mdm": {**shape, "objective": "mdm", "vocab_size": 2049}},
        "gen_length": 64,
        "prompt": "none",
        "eos": "none",
        "temperatures": [0.7, 0.85, 1.0],
        "diffusion_steps": [8, 16, 32, 64],
        "bd_block_size": 16,
        "batch_sizes": [1, 32],
        "rounds": 5,
        "warmup": 1,
        "processes": 2,
    }
    return {**base, **changes}


def measured(median: float, recorded: dict, tokens: int = 64, threads: int = 2) -> Throughput:
    ar = record("ar T=1", 1, median, median - 5, median + 5)
    ar = Record(**{**vars(ar), "round_tokens": [tokens] * 3})
    probe = [record("probe", 1, 1000, 990, 1010)]
    return Throughput([ar], {"cpu": "test", "torch_threads": threads}, [], probe, recorded)


def test_a_demo_run_and_a_smoke_run_are_refused_naming_what_differs():
    smoke_shape = {"objective": "ar", "dim": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 64}
    smoke = setup(
        preset="smoke",
        models={"ar": smoke_shape, "mdm": setup()["models"]["mdm"]},
        gen_length=24,
        temperatures=[0.8, 1.0],
    )
    with pytest.raises(ConfigError) as refused:
        compare_runs(measured(100, setup()), measured(230, smoke, tokens=24), ("demo", "smoke"))
    message = str(refused.value)
    assert message.startswith("demo and smoke measured different things")
    for said in (
        "preset 'demo' vs 'smoke'",
        "the ar model's dim 256 vs 64",
        "the ar model's n_layers 4 vs 2",
        "gen_length 64 vs 24",
        "temperatures [0.7, 0.85, 1.0] vs [0.8, 1.0]",
        "generated 64 vs 24 tokens per sample",
    ):
        assert said in message, said
    assert "\n" not in message
    # Repeating the measurement differently (rounds, warm-up, processes, batch sizes) is allowed.
    again = setup(rounds=6, warmup=2, processes=1, batch_sizes=[1, 64])
    (batch,) = compare_runs(measured(100, setup()), measured(101, again))
    assert batch.verdict == REPRODUCED


def test_a_family_timed_by_one_run_only_or_other_threads_are_refused():
    ar_only = setup(models={"ar": setup()["models"]["ar"]})
    with pytest.raises(ConfigError, match=r"models of \['ar', 'mdm'\] vs \['ar'\]"):
        compare_runs(measured(100, setup()), measured(100, ar_only))
    with pytest.raises(ConfigError, match="torch threads 2 vs 4"):
        compare_runs(measured(100, setup()), measured(100, setup(), threads=4))


def test_runs_without_a_recorded_setup_are_checked_on_what_they_record(tmp_path, capsys):
    # Older runs: the tokens each setting generated per sample still tell a 24-token run from a
    # 64-token one.
    with pytest.raises(ConfigError, match="'ar T=1' at batch 1 generated 64 vs 24 tokens"):
        compare_runs(measured(100, {}), measured(230, {}, tokens=24))
    # Only one of the two recording its setup cannot be checked: refused, naming which.
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(measured(100, setup()).as_dict()))
    stored = measured(100, {}).as_dict()
    del stored["setup"]
    old.write_text(json.dumps({"key": "k", "result": stored}))
    assert main([str(new), str(old)]) == 2
    line = error_line(capsys)
    assert f"{old} records no setup" in line and f"while {new} does" in line
    assert f"rerun the throughput stage of {old}" in line
    # Neither: compared, and the output says what could not be checked.
    assert main([str(old), str(old)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Neither run records its setup") and "### Batch 1: reproduced" in out


def test_merging_runs_of_different_setups_is_refused():
    with pytest.raises(ValueError, match="recorded different setups"):
        merge_runs([measured(100, setup()), measured(100, setup(gen_length=24))])
    merged = merge_runs([measured(100, setup()), measured(100, setup())])
    assert merged.setup == setup() and Throughput.from_dict(merged.as_dict()) == merged


def broken(data: dict, *path_and_value) -> dict:
    """``data`` (a measurement's dict) with the value at a path replaced (or deleted: None)."""
    *path, value = path_and_value
    copy = json.loads(json.dumps(data))
    target = copy
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy


@pytest.mark.parametrize(
    "change, said",
    [
        (
            ("records", 0, "tokens_per_s", "median", "fast"),
            "records[0].tokens_per_s.median is 'fast' (a string); expected a number",
        ),
        (("records", 0, "tokens_per_s", None), "records[0] has no field 'tokens_per_s'"),
        (("records", 0, "batch_size", None), "records[0] has no field 'batch_size'"),
        (
            ("records", 0, "tokens_per_s", "low", float("nan")),
            "records[0].tokens_per_s.low is nan; expected a finite number",
        ),
        (
            ("records", 0, "tokens_per_s", {"median": 100, "low": 120, "high": 90}),
            "records[0].tokens_per_s: median 100 outside [low 120, high 90]",
        ),
        (
            ("records", 0, "tokens_per_s", {"median": 0, "low": 0, "high": 0}),
            "records[0].tokens_per_s.median is 0",
        ),
        (("probes", 0, "batch_size", "1"), "probes[0].batch_size is '1'; expected an integer"),
        (("records", 0, "round_tokens", [1.5]), "records[0].round_tokens is [1.5]"),
        (("records", "x"), "'records' is 'x' (a string); expected a list"),
        (("records", ["x"]), "records[0] is 'x' (a string); expected an object"),
        (("machine", None), "'machine' is missing; expected an object"),
        (("setup", []), "'setup' is [] (a list); expected an object"),
    ],
)
def test_a_file_that_is_not_a_measurement_is_one_line_naming_the_field(
    tmp_path, capsys, change, said
):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(measured(100, setup()).as_dict()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken(measured(100, setup()).as_dict(), *change)))
    assert main([str(good), str(bad)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: {bad}: ") and said in line, line


def test_a_json_list_or_a_broken_file_is_one_line(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(measured(100, setup()).as_dict()))
    for text, said in (
        ("[1, 2]", "a JSON list, not a throughput measurement"),
        ('"x"', "a JSON string, not a throughput measurement"),
        ("{not json", "not JSON"),
        ('{"records": [], "tokens": NaN', "not JSON"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        assert main([str(good), str(bad)]) == 2
        line = error_line(capsys)
        assert line.startswith(f"error: {bad}: ") and said in line, line
    (tmp_path / "folder.json").mkdir()
    assert main([str(good), str(tmp_path / "folder.json")]) == 2
    assert "is a folder" in error_line(capsys)


def test_the_json_output_is_checked_before_anything_is_read(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(measured(100, setup()).as_dict()))
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "pipe")
    for target, said in (
        (tmp_path / "out", "is a folder, not a regular file"),
        (tmp_path / "pipe", "is a FIFO (named pipe), not a regular file"),
        (tmp_path / "no" / "s.json", "the folder"),
    ):
        assert main([str(good), str(tmp_path / "missing.json"), "--json", str(target)]) == 2
        line = error_line(capsys)
        assert line.startswith(f"error: --json {target}") and said in line, line
    assert main([str(good), str(good), "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())[0]["verdict"] == REPRODUCED


def test_the_comparison_stage_records_what_it_measured(tmp_path, monkeypatch):
    from eval.experiments import compare_speed
    from eval.experiments.compare_settings import COMPARE_PRESETS

    settings = COMPARE_PRESETS["smoke"]
    for family in ("ar", "mdm"):
        (tmp_path / family).mkdir()
        (tmp_path / family / "config.json").write_text(json.dumps({"preset": "smoke"}))
    states = {
        "ar": {"objective": "ar", "model_config": {"dim": 32, "n_layers": 2}},
        "mdm": {"objective": "mdm", "model_config": {"dim": 32, "n_layers": 2}},
    }
    monkeypatch.setattr(compare_speed, "sampling_checkpoint", lambda run: (run, "final"))
    monkeypatch.setattr(compare_speed, "resolve_checkpoint", lambda path, log: path)
    monkeypatch.setattr(compare_speed, "read_state", lambda path: states[path.name])
    recorded = compare_speed.measured_setup(tmp_path, settings, 2)
    assert recorded["preset"] == "smoke" and recorded["gen_length"] == settings.gen_length
    assert recorded["models"]["mdm"] == {"objective": "mdm", "dim": 32, "n_layers": 2}
    assert recorded["temperatures"] == list(settings.temperatures)
    assert recorded["batch_sizes"] == list(settings.frontier_batches)
    assert json.loads(json.dumps(recorded)) == recorded  # stored as JSON in the stage


def process(ratios: dict[str, float], ar_seconds: float = 1.0) -> Throughput:
    """One process's run: the AR at 100 tokens per round, each setting ``ratio`` times as fast
    in the same two rounds (the host's speed ``ar_seconds`` shared by the round)."""

    def timed(name: str, seconds: float) -> Record:
        spread = Spread(100 / seconds, 100 / seconds, 100 / seconds)
        return Record(name, 1, 2, 1, spread, spread, [seconds] * 2, [100, 100], [0, 1])

    records = [timed("ar T=1", ar_seconds)]
    records += [timed(name, ar_seconds / ratio) for name, ratio in ratios.items()]
    return Throughput(records, {"cpu": "test"})


def test_reruns_are_compared_on_their_ratios_to_the_ar():
    # The host ran 20% slower in the rerun: tokens/s do not reproduce, the ratios do.
    first = merge_runs([process({"m": r}) for r in (2.9, 3.0, 3.1)])
    slower = merge_runs([process({"m": r}, ar_seconds=1.25) for r in (2.95, 3.0, 3.05)])
    (batch,) = compare_runs(first, slower)
    assert batch.verdict == NO_PROBES
    assert batch.ratio_verdict == RATIOS_REPRODUCED
    (pair,) = batch.ratios
    assert pair.name == "m" and pair.first.mean == pytest.approx((2.9 * 3.0 * 3.1) ** (1 / 3))
    assert pair.inside and pair.rerun_interval == pair.first.rerun_interval(3)
    assert pair.first.over == "processes" and pair.first.count == 3
    # a rerun whose ratio moved past the first run's interval
    moved = merge_runs([process({"m": r}) for r in (3.6, 3.7, 3.8)])
    (batch,) = compare_runs(first, moved)
    assert batch.ratio_verdict == RATIOS_NOT_REPRODUCED and not batch.ratios[0].inside
    # one process: no interval to hold a rerun
    (batch,) = compare_runs(process({"m": 3.0}), first)
    assert batch.ratio_verdict == NO_RATIO_INTERVAL


def test_one_setting_of_two_outside_its_95_percent_interval_is_within_chance():
    first = merge_runs([process({"m": r, "k": r}) for r in (2.9, 3.0, 3.1)])
    ((low, high),) = {p.rerun_interval for p in compare_runs(first, first)[0].ratios}
    # m's rerun above its 95% interval for a rerun but inside the family-wise one (2 settings:
    # 97.5%), k's inside both
    rerun = merge_runs([process({"m": 1.04 * high, "k": 3.0}) for _ in range(3)])
    (batch,) = compare_runs(first, rerun)
    assert [p.inside for p in batch.ratios] == [False, True]
    assert batch.ratio_verdict == RATIOS_WITHIN_CHANCE
    beyond = merge_runs([process({"m": 1.2 * high, "k": 3.0}) for _ in range(3)])
    assert compare_runs(first, beyond)[0].ratio_verdict == RATIOS_NOT_REPRODUCED


def test_the_command_prints_and_writes_the_ratio_verdict(tmp_path, capsys):
    first = merge_runs([process({"m": r}) for r in (2.9, 3.0, 3.1)])
    second = merge_runs([process({"m": r}, ar_seconds=1.1) for r in (3.0, 3.0, 3.1)])
    paths = []
    for name, measured in (("a.json", first), ("b.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps({"result": measured.as_dict()}))
    summary = tmp_path / "summary.json"
    assert main([str(paths[0]), str(paths[1]), "--json", str(summary)]) == 0
    out = capsys.readouterr().out
    assert "Ratios to the AR (ar T=1) in the same rounds: ratios reproduced." in out
    # the geometric mean [95% t-interval of the logs], and the wider interval for a rerun's mean
    assert "| m | 2.999 [2.760, 3.258] | 3.033 [2.894, 3.179] | [2.667, 3.372] | yes |" in out
    assert "t(0.975, n1 - 1) * s1 * sqrt(1/n1 + 1/n2)" in out
    written = json.loads(summary.read_text())[0]
    assert written["ratio_verdict"] == RATIOS_REPRODUCED and written["ratios"]["m"]["inside"]


def test_a_damaged_process_run_is_one_line(tmp_path, capsys):
    data = merge_runs([process({"m": 3.0}), process({"m": 3.0})]).as_dict()
    data["processes"][1]["records"][0]["tokens_per_s"]["median"] = "fast"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main([str(path), str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "processes[1]: records[0].tokens_per_s.median is 'fast'" in err
    assert len(err.splitlines()) == 1
