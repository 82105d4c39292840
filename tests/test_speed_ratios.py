"""A setting's speed as a ratio to the AR's in the same rounds, replicated over processes
(eval/speed/ratios.py), and the per-process runs a pooled measurement keeps for it
(eval.speed.throughput.merge_runs)."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from eval.speed.frontier import ratios_of
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
    # Per-round ratios 3, 1, 3: their median is 3, while the ratio of the two medians over the
    # rounds (300 / 100) and the ratio of the means (250 / 116.7) are not.
    one = run(
        {
            "ar T=1": [(100, 1.0), (200, 1.0), (50, 1.0)],
            "fast": [(300, 1.0), (200, 1.0), (150, 1.0)],
        }
    )
    assert round_ratios(one, "fast", 1) == [3.0, 1.0, 3.0]
    assert process_ratios(one, "fast", 1) == [pytest.approx(3.0)]
    # An even number of rounds: the midpoint on logs, sqrt(2 * 8), not (2 + 8) / 2.
    drift = run({"ar T=1": [(100, 1.0), (100, 8.0)], "fast": [(100, 0.5), (100, 1.0)]})
    assert round_ratios(drift, "fast", 1) == [2.0, 8.0]
    assert process_ratios(drift, "fast", 1) == [pytest.approx(4.0)]


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


def test_estimate_over_processes_then_over_seed_means_on_log_ratios():
    one_seed = ratio_estimate([[2.0, 2.5, 2.5]])
    logs = [math.log(2.0), math.log(2.5), math.log(2.5)]
    centre = statistics.fmean(logs)
    half = stats.t.ppf(0.975, 2) * statistics.stdev(logs) / math.sqrt(3)
    assert one_seed.over == "processes" and one_seed.count == 3
    assert one_seed.mean == pytest.approx((2.0 * 2.5 * 2.5) ** (1 / 3))
    assert one_seed.interval == pytest.approx((math.exp(centre - half), math.exp(centre + half)))
    assert one_seed.log_sd == pytest.approx(statistics.stdev(logs))
    assert "over 3 processes" in one_seed.text()
    # 2x and 0.5x average to 1x
    assert ratio_estimate([[2.0, 0.5]]).mean == pytest.approx(1.0)
    seeds = ratio_estimate([[2.0, 2.0], [1.25, 5.0], [2.5, 2.5]])  # seed means 2, 2.5, 2.5
    assert seeds.over == "seeds" and seeds.count == 3 and seeds.mean == pytest.approx(one_seed.mean)
    assert seeds.interval == pytest.approx(one_seed.interval)
    single = ratio_estimate([[1.5]])
    assert single.interval is None and single.text() == "1.5x (1 process, no interval)"
    assert single.rerun_interval(3) is None and not single.holds(1.5, 3)
    with pytest.raises(ValueError, match="no ratios"):
        ratio_estimate([[]])


def test_the_rerun_interval_is_the_two_sample_prediction_interval():
    first = ratio_estimate([[2.0, 2.5, 2.5]])
    for rerun in (1, 3, 10):
        half = stats.t.ppf(0.975, 2) * first.log_sd * math.sqrt(1 / 3 + 1 / rerun)
        low, high = first.rerun_interval(rerun)
        assert (math.log(low), math.log(high)) == pytest.approx(
            (math.log(first.mean) - half, math.log(first.mean) + half)
        )
        assert first.holds(low * 1.0001, rerun) and not first.holds(high * 1.0001, rerun)
    # wider than the interval for the first run's own mean, which ignores the rerun's noise
    assert first.rerun_interval(3)[1] > first.interval[1]


def simulated_reruns(
    shift: float, processes: tuple[int, int], log_sd: float = 0.05, seed: int = 0
) -> float:
    """The share of simulated reruns inside the first run's 95% interval for them, in a setting
    whose process ratios are log-normal around 3 (standard deviation ``log_sd`` of the log),
    the rerun's true ratio ``shift`` times the first's."""
    generator = np.random.default_rng(seed)
    n1, n2 = processes
    inside = 0
    for _ in range(RERUNS):
        first = np.exp(math.log(3.0) + log_sd * generator.standard_normal(n1))
        second = np.exp(math.log(3.0 * shift) + log_sd * generator.standard_normal(n2))
        rerun = ratio_estimate([second.tolist()])
        inside += ratio_estimate([first.tolist()]).holds(rerun.mean, rerun.count)
    return inside / RERUNS


RERUNS = 4000


def test_a_perfectly_reproducible_setting_lands_inside_at_the_nominal_rate():
    # 0.95 +- 0.0034 (one binomial sd over 4000 reruns); the first run's own-mean interval
    # would hold about 91% at 3 processes a side
    for processes in ((3, 3), (3, 5), (5, 2)):
        assert 0.93 <= simulated_reruns(1.0, processes) <= 0.97, processes


def test_a_real_ten_percent_shift_lands_outside_most_of_the_time():
    # processes 2-3% apart (batch 1 in docs/studies/frontier-reruns): a 10% move is 3-5 of them
    assert simulated_reruns(1.1, (3, 3), log_sd=0.02) < 0.25
    assert simulated_reruns(1 / 1.1, (5, 5), log_sd=0.03) < 0.1


def test_estimate_text():
    estimate = RatioEstimate(3.14159, (2.9, 3.3), 3, "processes")
    assert estimate.text() == "3.14x (95% t-interval [2.9, 3.3] over 3 processes)"


def test_a_record_without_timed_rounds_is_a_key_error_not_a_crash():
    spread = Spread(1.0, 1.0, 1.0)

    def untimed(name: str) -> Record:
        return Record(name, 1, 1, 0, spread, spread, [], [], [])

    bare = Throughput([untimed("ar T=1"), untimed("fast")], {})
    with pytest.raises(KeyError, match="'fast' kept no timed rounds at batch 1"):
        process_ratios(bare, "fast", 1)
    assert ratios_of(bare, "fast", 1) == ()  # the frontier reads it as not measured
    timed = record_of("fast", 1, 1, [1.0], [1], [0])
    with pytest.raises(KeyError, match="'ar T=1' kept no timed rounds"):
        round_ratios(Throughput([untimed("ar T=1"), timed], {}), "fast", 1)
    with pytest.raises(KeyError, match="ar T=1"):  # and one without the AR at all
        round_ratios(Throughput([timed], {}), "fast", 1)
