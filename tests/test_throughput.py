"""The throughput measurement (eval/speed/throughput.py) with fake generation callables and a fake
clock: the alternation, the warm-up exclusion, median/min/max and the token accounting are
checked exactly, never against wall time."""

import dataclasses

import pytest

from eval.speed.throughput import (
    PROBE_DISPATCH,
    PROBE_MATMUL,
    Setting,
    Spread,
    Throughput,
    host_probes,
    measure,
    measure_batches,
    merge_runs,
    rotation,
)


class FakeClock:
    """A clock that only moves when a fake generation runs."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake(clock: FakeClock, log: list[str], name: str, durations: list[float], tokens: int):
    """A generation callable that logs its name, advances the clock by its next duration and
    returns ``tokens``."""
    queue = iter(durations)

    def run() -> int:
        log.append(name)
        clock.now += next(queue)
        return tokens

    return run


def test_rotation_moves_the_first_setting_each_round():
    assert [rotation(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert rotation(1, 5) == [0]


def test_warmup_is_untimed_and_rounds_alternate_with_rotated_order():
    clock, log = FakeClock(), []
    # The first call of each setting (the warm-up) is slow, 50 s; it must not enter any number.
    a = Setting("a", 4, fake(clock, log, "a", [50.0, 1.0, 2.0, 4.0], tokens=64))
    b = Setting("b", 4, fake(clock, log, "b", [50.0, 8.0, 8.0, 8.0], tokens=32))
    c = Setting("c", 4, fake(clock, log, "c", [50.0, 0.5, 0.25, 1.0], tokens=16))
    result = measure([a, b, c], rounds=3, warmup=1, clock=clock)
    # Warm-up in list order, then round 0: a b c, round 1: b c a, round 2: c a b.
    assert log == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    ra, rb, rc = result.records
    assert ra.round_seconds == [1.0, 2.0, 4.0]
    assert ra.positions == [0, 2, 1]
    assert rb.positions == [1, 0, 2]
    assert rc.positions == [2, 1, 0]
    # Tokens/s per round: 64/1, 64/2, 64/4 -> median 32, min 16, max 64.
    assert ra.tokens_per_s == Spread(32.0, 16.0, 64.0)
    assert ra.seconds_per_sample == Spread(0.5, 0.25, 1.0)
    assert rb.tokens_per_s == Spread(4.0, 4.0, 4.0)
    assert rc.tokens_per_s == Spread(32.0, 16.0, 64.0)
    assert ra.round_tokens == [64, 64, 64]
    assert (ra.batch_size, ra.rounds, ra.warmup) == (4, 3, 1)


def test_generated_tokens_are_what_each_round_returns():
    # A sampler that stops at EOS generates fewer tokens in some rounds: each round's own count
    # is its numerator (nothing is assumed from the batch size or the length).
    clock, counts = FakeClock(), iter([999, 10, 30, 20])

    def run() -> int:
        clock.now += 1.0
        return next(counts)

    record = measure([Setting("eos", 2, run)], rounds=3, warmup=1, clock=clock).records[0]
    assert record.round_tokens == [10, 30, 20]
    assert record.tokens_per_s == Spread(20.0, 10.0, 30.0)


def test_no_warmup_times_the_first_call():
    clock, log = FakeClock(), []
    record = measure(
        [Setting("a", 1, fake(clock, log, "a", [3.0, 1.0], tokens=6))],
        rounds=2,
        warmup=0,
        clock=clock,
    ).records[0]
    assert record.round_seconds == [3.0, 1.0]
    assert record.tokens_per_s == Spread(4.0, 2.0, 6.0)


def test_result_records_machine_and_versions():
    clock = FakeClock()
    result = measure([Setting("a", 1, fake(clock, [], "a", [1.0] * 4, 8))], rounds=3, clock=clock)
    machine = result.machine
    assert machine["cpu"] and machine["cpu_count"] >= 1 and machine["torch_threads"] >= 1
    assert machine["versions"]["torch"] and machine["versions"]["python"]
    text = result.markdown()
    assert "| a | 1 | 8 [8, 8] |" in text and machine["cpu"] in text
    assert result.as_dict()["records"][0]["tokens_per_s"] == {
        "median": 8.0,
        "low": 8.0,
        "high": 8.0,
    }


def test_sync_runs_around_every_timed_call():
    clock, events = FakeClock(), []

    def run() -> int:
        events.append("run")
        clock.now += 1.0
        return 1

    measure(
        [Setting("a", 1, run)], rounds=2, warmup=1, clock=clock, sync=lambda: events.append("sync")
    )
    assert events == ["run", "sync", "run", "sync", "sync", "run", "sync"]


@pytest.mark.parametrize(
    ("settings", "kwargs", "message"),
    [
        ([], {}, "at least one setting"),
        ([Setting("a", 0, lambda: 1)], {}, "batch_size=0"),
        ([Setting("a", 1, lambda: 1), Setting("a", 1, lambda: 1)], {}, "distinct"),
        ([Setting("a", 1, lambda: 1)], {"rounds": 0}, "rounds=0"),
        ([Setting("a", 1, lambda: 1)], {"warmup": -1}, "warmup=-1"),
        ([Setting("a", 1, lambda: None)], {}, "number of generated tokens"),
    ],
)
def test_bad_input_is_refused_in_one_line(settings, kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure(settings, **kwargs)


def test_a_clock_that_does_not_move_is_refused():
    with pytest.raises(ValueError, match="clock did not advance"):
        measure([Setting("a", 1, lambda: 1)], rounds=1, warmup=0, clock=lambda: 1.0)


def test_batches_alternate_within_a_size_and_stop_at_the_first_that_does_not_fit():
    clock, log = FakeClock(), []

    def make(name: str, batch: int):
        def run() -> int:
            if batch > 8:
                raise MemoryError("fake: does not fit")
            log.append((name, batch))
            clock.now += batch / 4
            return 16 * batch

        return run

    result = measure_batches(make, ["ar", "mdm"], [64, 1, 8, 512], rounds=2, warmup=1, clock=clock)
    # Smallest batch first; inside each batch the two settings alternate.
    assert log == [("ar", 1), ("mdm", 1), ("ar", 1), ("mdm", 1), ("mdm", 1), ("ar", 1)] + [
        ("ar", 8),
        ("mdm", 8),
        ("ar", 8),
        ("mdm", 8),
        ("mdm", 8),
        ("ar", 8),
    ]
    assert [(r.name, r.batch_size) for r in result.records] == [
        ("ar", 1),
        ("mdm", 1),
        ("ar", 8),
        ("mdm", 8),
    ]
    assert result.record("ar", 8).tokens_per_s == Spread(64.0, 64.0, 64.0)
    assert result.notes == [
        "batch 64 does not fit in memory (the largest that fits is 8); "
        "larger batches ([512]) were not tried"
    ]
    assert "batch 64 does not fit" in result.markdown()


def test_no_batch_fits():
    def make(name: str, batch: int):
        def run() -> int:
            raise MemoryError

        return run

    result = measure_batches(make, ["a"], [1, 4], clock=FakeClock())
    assert result.records == [] and "no batch size fitted" in result.notes[0]


def test_probes_join_the_rotation_and_are_returned_apart():
    clock, log = FakeClock(), []
    a = Setting("a", 2, fake(clock, log, "a", [9.0, 1.0, 1.0], tokens=8))
    probe = Setting("probe", 1, fake(clock, log, "probe", [9.0, 0.5, 0.25], tokens=100))
    result = measure([a], rounds=2, warmup=1, clock=clock, probes=[probe])
    # Warm-up, then round 0: a probe, round 1: probe a.
    assert log == ["a", "probe", "a", "probe", "probe", "a"]
    assert [r.name for r in result.records] == ["a"]
    (p,) = result.probes
    assert p.name == "probe" and p.positions == [1, 0]
    assert p.tokens_per_s == Spread(300.0, 200.0, 400.0)
    assert result.records[0].positions == [0, 1]
    assert "Host probes timed in the same rounds" in result.markdown()
    # A probe may not share a setting's name and batch size.
    with pytest.raises(ValueError, match="distinct"):
        measure([a], probes=[Setting("a", 2, lambda: 1)], clock=clock)


def test_probes_run_beside_every_batch_size_and_survive_a_round_trip():
    clock = FakeClock()

    def make(name: str, batch: int):
        def run() -> int:
            clock.now += 1.0
            return batch

        return run

    def probe() -> int:
        clock.now += 2.0
        return 10

    result = measure_batches(
        make, ["a"], [1, 4], rounds=2, warmup=0, clock=clock, probes=[Setting("p", 1, probe)]
    )
    assert [(r.name, r.batch_size) for r in result.probes] == [("p", 1), ("p", 4)]
    assert all(r.tokens_per_s == Spread(5.0, 5.0, 5.0) for r in result.probes)
    again = Throughput.from_dict(result.as_dict())
    assert again == result
    # A measurement stored before the probes existed reads back with none.
    old = {k: v for k, v in result.as_dict().items() if k != "probes"}
    assert Throughput.from_dict(old).probes == []


def test_host_probes_count_their_operations():
    matmul, dispatch = host_probes()
    assert (matmul.name, dispatch.name) == (PROBE_MATMUL, PROBE_DISPATCH)
    assert matmul.run() == 16 and dispatch.run() == 2000


def test_runs_in_separate_processes_pool_their_rounds():
    def one_run(durations: list[float], probe_durations: list[float]) -> Throughput:
        clock = FakeClock()
        a = Setting("a", 2, fake(clock, [], "a", [9.0, *durations], tokens=8))
        p = Setting("p", 2, fake(clock, [], "p", [9.0, *probe_durations], tokens=4))
        return measure([a], rounds=len(durations), warmup=1, clock=clock, probes=[p])

    first, second = one_run([1.0, 2.0], [1.0, 1.0]), one_run([4.0, 8.0], [2.0, 2.0])
    merged = merge_runs([first, second])
    (a,) = merged.records
    assert a.round_seconds == [1.0, 2.0, 4.0, 8.0] and a.rounds == 4
    # Tokens/s per round 8, 4, 2, 1: the median of four, and the spread of both runs.
    assert a.tokens_per_s == Spread(3.0, 1.0, 8.0)
    assert a.seconds_per_sample == Spread(1.5, 0.5, 4.0)
    assert merged.probes[0].tokens_per_s == Spread(3.0, 2.0, 4.0)
    # one run merged is that run, which it keeps as its one process
    single = merge_runs([first])
    assert single.processes == [first] and dataclasses.replace(single, processes=[]) == first
    assert merged.processes == [first, second]
    with pytest.raises(ValueError, match="at least one"):
        merge_runs([])
    other = measure([Setting("b", 2, lambda: 1)], rounds=1, warmup=0, clock=iter(range(9)).__next__)
    with pytest.raises(ValueError, match="different settings"):
        merge_runs([first, other])
