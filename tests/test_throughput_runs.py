"""Two throughput runs compared (eval/throughput_runs.py): the within-spread test, the ratios and
the verdict rule on constructed measurements."""

import json

import pytest

from eval.throughput import Record, Spread, Throughput
from eval.throughput_runs import (
    HOST_CHANGED,
    NO_PROBES,
    NOT_REPRODUCED,
    REPRODUCED,
    compare_runs,
    main,
)


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
    main([str(a), str(b), "--json", str(tmp_path / "s.json")])
    text = capsys.readouterr().out
    assert "### Batch 1: not reproduced" in text and "| ar | 100 [95, 105] | 70 [65, 75] |" in text
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary[0]["verdict"] == NOT_REPRODUCED and summary[0]["probe_ratios"] == {"probe": 1.0}
    (tmp_path / "bad.json").write_text('{"rows": []}')
    with pytest.raises(SystemExit, match="no 'records'"):
        main([str(a), str(tmp_path / "bad.json")])
    with pytest.raises(SystemExit, match="cannot read"):
        main([str(a), str(tmp_path / "missing.json")])
