"""A setting's speed as a ratio to the AR's in the same rounds, replicated over processes
(eval/speed/ratios.py), and the per-process runs a pooled measurement keeps for it
(eval.speed.throughput.merge_runs)."""

import math

import pytest

from eval.speed.ratios import RatioEstimate, process_ratios, ratio_estimate, round_ratios
from eval.speed.throughput import Record, Spread, Throughput, merge_runs, record_of


def run(rounds: dict[str, list[tuple[int, float]]], batch: int = 1) -> Throughput:
    """One process's measurement: per setting, its (tokens, seconds) in each round."""
    records = [
        record_of(name, batch, 1, [s for _, s in r], [n for n, _ in r], list(range(len(r))))
        for name, r in rounds.items()
    ]
    return Throughput(records, {"torch_threads": 1})


def test_each_round_is_divided_by_the_ar_in_the_same_round():
    # The host slows down in round 2 for both: the per-round ratio stays 2, while the ratio of
    # the two medians over rounds would not be (medians 150 and 100 -> 1.5 in other layouts).
    one = run(
        {
            "ar T=1": [(100, 1.0), (100, 2.0), (100, 1.0)],
            "fast": [(200, 1.0), (200, 2.0), (200, 1.0)],
        }
    )
    assert round_ratios(one, "fast", 1) == [2.0, 2.0, 2.0]
    assert process_ratios(one, "fast", 1) == [2.0]
    drift = run({"ar T=1": [(100, 1.0), (100, 4.0)], "fast": [(100, 0.5), (100, 1.0)]})
    assert round_ratios(drift, "fast", 1) == [2.0, 4.0]
    assert process_ratios(drift, "fast", 1) == [3.0]  # the median of two rounds


def test_missing_or_unpaired_rounds_are_refused():
    one = run({"ar T=1": [(100, 1.0)], "fast": [(200, 1.0), (200, 1.0)]})
    with pytest.raises(ValueError, match="not timed in the same rounds"):
        round_ratios(one, "fast", 1)
    with pytest.raises(KeyError):
        process_ratios(one, "fast", batch_size=32)
    with pytest.raises(KeyError):
        process_ratios(run({"fast": [(1, 1.0)]}), "fast", 1)


def test_a_pooled_measurement_gives_one_ratio_per_process():
    processes = [
        run({"ar T=1": [(100, 1.0), (100, 1.0)], "fast": [(100, 0.5), (100, 0.5)]}),
        run({"ar T=1": [(100, 2.0), (100, 2.0)], "fast": [(100, 0.8), (100, 0.8)]}),
        run({"ar T=1": [(100, 1.0), (100, 1.0)], "fast": [(100, 0.4), (100, 0.4)]}),
    ]
    pooled = merge_runs(processes)
    assert pooled.record("fast", 1).rounds == 6
    assert process_ratios(pooled, "fast", 1) == pytest.approx([2.0, 2.5, 2.5])
    # and the runs survive the stage file
    back = Throughput.from_dict(pooled.as_dict())
    assert process_ratios(back, "fast", 1) == pytest.approx([2.0, 2.5, 2.5])
    assert "processes" not in processes[0].as_dict()


def test_estimate_over_processes_then_over_seed_means():
    one_seed = ratio_estimate([[2.0, 2.5, 2.5]])
    half = 4.302652729911275 * math.sqrt(1 / 12) / math.sqrt(3)  # sd of (2, 2.5, 2.5)
    assert one_seed.over == "processes" and one_seed.count == 3
    assert one_seed.mean == pytest.approx(7 / 3)
    assert one_seed.interval == pytest.approx((7 / 3 - half, 7 / 3 + half))
    assert "over 3 processes" in one_seed.text()
    seeds = ratio_estimate([[1.5, 2.5], [2.5, 2.5], [2.0, 3.0]])
    assert seeds.over == "seeds" and seeds.count == 3 and seeds.mean == pytest.approx(7 / 3)
    assert seeds.interval == pytest.approx(one_seed.interval)  # seed means 2, 2.5, 2.5
    single = ratio_estimate([[1.5]])
    assert single.interval is None and single.text() == "1.5x (1 process, no interval)"
    assert not single.holds(1.5)
    assert one_seed.holds(2.3) and not one_seed.holds(5.0)
    with pytest.raises(ValueError, match="no ratios"):
        ratio_estimate([[]])


def test_estimate_text():
    estimate = RatioEstimate(3.14159, (2.9, 3.3), 3, "processes")
    assert estimate.text() == "3.14x (95% t-interval [2.9, 3.3] over 3 processes)"


def test_record_without_rounds_is_a_key_error_not_a_crash():
    spread = Spread(1.0, 1.0, 1.0)
    lone = Throughput([Record("fast", 1, 1, 0, spread, spread, [1.0], [1], [0])], {})
    with pytest.raises(KeyError, match="ar T=1"):
        round_ratios(lone, "fast", 1)
