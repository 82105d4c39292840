"""The speed-quality frontier (eval/speed/frontier.py, eval/speed/frontier_headline.py) on
constructed points: the Pareto rule and its ties, the marks (low-entropy at its floor, repetitive
above its ceiling, unknown), the front with and without marked points, the table and figure, and the
headline rule's sentence (ties in speed and in quality, one point per family, everything marked,
several seeds, no AR); and the held-out bounds the marks use (eval/sample_sets.py)."""

import math
import re
from dataclasses import replace

import pytest

from eval.speed.frontier import (
    LOW_ENTROPY,
    REPETITIVE,
    UNKNOWN,
    Point,
    dominates,
    front_markdown,
    frontier,
    frontier_figure,
    mark,
    pareto_front,
    points_from_stages,
)
from eval.speed.frontier_headline import (
    HEADLINE_RULE,
    headline,
    passing_settings,
    report_frontier,
    seed_means,
)

FLOOR, CEILING = 3.6, 0.05  # held-out text's entropy floor and repetition ceiling


def point(family, setting, speed, ppl, entropy=3.9, batch=64, ci=None, repetition=0.01):
    return Point(family, setting, batch, speed, ppl, ci, entropy, FLOOR, repetition, CEILING)


def names(points):
    return [p.setting for p in points]


def test_dominance_needs_one_strict_improvement():
    a, b = point("x", "a", 10, 5), point("x", "b", 10, 5)
    assert not dominates(a, b) and not dominates(b, a)
    assert dominates(point("x", "c", 11, 5), a)
    assert dominates(point("x", "d", 10, 4), a)
    assert not dominates(point("x", "e", 11, 6), a)


def test_pareto_front_fastest_first_and_equal_points_both_kept():
    points = [
        point("ar", "ar T=1", 1000, 100),
        point("mdm", "fast", 4000, 300),
        point("mdm", "twin", 4000, 300),  # equal to "fast": both stay
        point("mdm", "slow-bad", 500, 400),  # dominated by everything
        point("mdm", "good", 200, 80),
        point("mdm", "middle", 1000, 150),  # same speed as the AR, worse perplexity
    ]
    assert names(pareto_front(points)) == ["fast", "twin", "ar T=1", "good"]


def test_dominated_within_interval_noise_is_still_dominated():
    # b's interval overlaps a's widely, but a's point estimate is better on both axes.
    a = point("ar", "a", 1000, 100, ci=(60, 160))
    b = point("mdm", "b", 900, 101, ci=(61, 162))
    assert names(pareto_front([a, b])) == ["a"]


def test_a_family_with_one_point_is_on_the_front_when_not_dominated():
    points = [point("ar", "ar T=1", 1000, 100), point("bd", "only", 3000, 200)]
    front = frontier(points)
    assert names(front.front) == ["only", "ar T=1"] == names(front.front_unmarked)


def test_marks_at_the_floor_the_ceiling_and_unknown():
    at_floor = point("mdm", "at", 10, 5, entropy=FLOOR)  # exactly at the floor: kept
    below = point("mdm", "below", 10, 5, entropy=FLOOR - 1e-9)
    unknown = point("mdm", "unknown", 10, 5, entropy=None)
    no_floor = Point("mdm", "no floor", 64, 10, 5, None, 3.9, None, 0.01, CEILING)
    at_ceiling = point("mdm", "at ceiling", 10, 5, repetition=CEILING)
    # a repeating cycle keeps its unigram entropy: only the repetition mark catches it
    cycle = point("mdm", "cycle", 10, 5, entropy=3.95, repetition=CEILING + 1e-9)
    no_repetition = point("mdm", "no repetition", 10, 5, repetition=None)
    points = [at_floor, below, unknown, no_floor, at_ceiling, cycle, no_repetition]
    front = frontier(points)
    assert {p.setting: front.marks[p.key] for p in front.marked} == {
        "below": LOW_ENTROPY,
        "unknown": UNKNOWN,
        "no floor": UNKNOWN,
        "cycle": REPETITIVE,
        "no repetition": UNKNOWN,
    }
    assert mark(at_floor) == mark(at_ceiling) == ""
    # unknown is never on the unmarked front, however good
    assert names(front.front_unmarked) == ["at", "at ceiling"]
    assert "(1 low-entropy, 1 repetitive, 3 unknown)" in front_markdown(front)


def test_front_with_and_without_marked_points():
    points = [
        point("ar", "ar T=1", 1000, 100),
        point("mdm", "repetitive", 2000, 50, entropy=2.8),  # beats the AR, but marked
        point("mdm", "honest", 2000, 150),
    ]
    front = frontier(points)
    assert names(front.marked) == ["repetitive"]
    assert names(front.front) == ["repetitive"]
    assert names(front.front_unmarked) == ["honest", "ar T=1"]


def test_every_point_marked_leaves_an_empty_unmarked_front():
    points = [point("mdm", "a", 10, 5, entropy=1.0), point("mdm", "b", 20, 6, entropy=1.0)]
    front = frontier(points)
    assert front.front_unmarked == [] and names(front.front) == ["b", "a"]
    assert "2 of 2 points marked" in front_markdown(front)


def test_frontier_refuses_mixed_batches_duplicates_and_bad_values():
    with pytest.raises(ValueError, match="several batch sizes"):
        frontier([point("a", "x", 1, 1, batch=1), point("a", "y", 1, 1, batch=64)])
    with pytest.raises(ValueError, match="appear once"):
        frontier([point("a", "x", 1, 1), point("a", "x", 2, 2)])
    with pytest.raises(ValueError, match="at least one"):
        frontier([])
    with pytest.raises(ValueError, match="judge_ppl=nan"):
        point("a", "x", 1, math.nan)


def test_markdown_table_lists_the_front_with_entropy_and_interval():
    points = [
        point("ar", "ar T=1", 12000, 620.0, ci=(560.0, 690.0), entropy=3.85),
        replace(point("mdm", "fixed 64", 430, 133.5, entropy=2.804), tpf=2.0, nfe=32),
    ]
    text = front_markdown(frontier(points))
    assert "| ar | ar T=1 | 12,000 | - | - | - | 620 [560, 690] | 3.850 (3.600) |  |" in text
    assert "| mdm | fixed 64 | 430 | - | 2 | 32 | 133.5 | 2.804 (3.600) | low-entropy |" in text
    # process ratios a factor 1.25 apart: geometric mean 0.04, t-interval of the logs mapped back
    measured = replace(points[1], speed_ratios=((0.032, 0.04, 0.05),))
    text = front_markdown(frontier([points[0], measured]))
    half = 4.302652729911275 * math.log(1.25) / math.sqrt(3)
    low, high = 0.04 * math.exp(-half), 0.04 * math.exp(half)
    assert f"| mdm | fixed 64 | 430 | 0.04 [{low:.3g}, {high:.3g}] | 2 | 32 |" in text
    assert "1 of 2 points marked" in text


def test_figure_draws_marked_points_hollow(tmp_path):
    points = [
        point("ar", "ar T=1", 12000, 620.0, ci=(560.0, 690.0)),
        point("mdm", "fixed 64", 430, 133.5, entropy=2.8),
        point("mdm", "ancestral 64", 425, 2061.0),
    ]
    figure = frontier_figure(frontier(points))
    axis = figure.axes[0]
    assert axis.get_xscale() == "log"
    faces = {
        container.get_label(): container.lines[0].get_markerfacecolor()
        for container in axis.containers
    }
    assert faces["mdm (marked)"] == "none" and faces["mdm"] != "none"
    figure.savefig(tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_headline_picks_the_fastest_qualifying_setting():
    points = [
        point("ar", "ar T=1", 10000, 100),
        point("ar", "ar T=0.7", 20000, 60),  # the AR's own settings are not candidates
        point("mdm", "too-bad", 9000, 151),  # over 1.5x
        point("mdm", "marked", 8000, 90, entropy=3.0),
        point("mdm", "ok-slow", 500, 120),
        point("mdm", "ok-fast", 2000, 150),  # exactly 1.5x qualifies
    ]
    text = headline({0: points}, 64)
    assert text.startswith(
        "At batch 64, the fastest setting within 1.5x of the AR's judge perplexity (and "
        "unmarked) is ok-fast, at 2,000 tokens/s (judge perplexity 150) against the AR's "
        "10,000 (judge perplexity 100): 0.2x in median tokens/s (no ratio measured in the same "
        "rounds). No perplexity interval: ties in quality"
    )


def test_headline_ties():
    base = [point("ar", "ar T=1", 1000, 100)]
    by_ppl = base + [point("mdm", "b", 800, 140), point("mdm", "a", 800, 130)]
    assert "is a, at 800 tokens/s" in headline({0: by_ppl}, 64)
    both = base + [point("mdm", "b", 800, 130), point("bd", "a", 800, 130)]
    assert "are a and b, at 800 tokens/s" in headline({0: both}, 64)


def measured(p, *per_seed):
    """``p`` with each seed's process ratios to the AR."""
    return replace(p, speed_ratios=tuple(tuple(ratios) for ratios in per_seed))


def test_headline_interval_over_seeds_of_the_process_means():
    def seed(ratio):
        m = point("mdm", "m", 1000 * ratio, 120)
        # three processes per seed, their geometric mean the seed's ratio
        return [point("ar", "ar T=1", 1000, 100), measured(m, (ratio / 1.1, ratio, ratio * 1.1))]

    # seeds a factor 1.2 apart: geometric mean 0.6, the log ratios' sd log(1.2)
    text = headline({0: seed(0.5), 1: seed(0.6), 2: seed(0.72)}, 64)
    half = 4.302652729911275 * math.log(1.2) / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    low, high = 0.6 * math.exp(-half), 0.6 * math.exp(half)
    assert "is m, at 607 tokens/s" in text
    assert f"0.6x (95% t-interval [{low:.3g}, {high:.3g}] over 3 seeds)" in text


def test_headline_interval_over_processes_with_one_seed():
    m = measured(point("mdm", "m", 600, 120), (0.6 / 1.1, 0.6, 0.66))
    text = headline({0: [point("ar", "ar T=1", 1000, 100), m]}, 64)
    half = 4.302652729911275 * math.log(1.1) / math.sqrt(3)
    low, high = 0.6 * math.exp(-half), 0.6 * math.exp(half)
    assert f"0.6x (95% t-interval [{low:.3g}, {high:.3g}] over 3 processes)" in text
    one = measured(point("mdm", "m", 600, 120), (0.6,))
    assert "0.6x (1 process, no interval)" in headline(
        {0: [point("ar", "ar T=1", 1000, 100), one]}, 64
    )


def test_headline_ranks_by_the_ratio_in_the_same_rounds():
    # "pooled" has the higher median tokens/s of the pooled rounds, but in the rounds it shared
    # with the AR it was the slower one: the ratio decides.
    ar = point("ar", "ar T=1", 1000, 100)
    pooled = measured(point("mdm", "pooled", 900, 120), (0.7, 0.72, 0.71))
    paired = measured(point("mdm", "paired", 850, 120), (0.8, 0.82, 0.81))
    assert "is paired, at 850 tokens/s" in headline({0: [ar, pooled, paired]}, 64)
    # one without a ratio: every candidate is ranked by tokens/s
    unpaired = point("mdm", "unpaired", 880, 120)
    assert "is pooled, at 900 tokens/s" in headline({0: [ar, pooled, paired, unpaired]}, 64)


def test_headline_when_nothing_qualifies():
    ar = point("ar", "ar T=1", 1000, 100)
    marked = [ar, point("mdm", "a", 900, 110, entropy=1.0), point("mdm", "b", 5, 120, entropy=1)]
    text = headline({0: marked}, 64)
    assert "no setting qualifies: all 2 settings within 1.5x" in text
    assert "(a: low-entropy, b: low-entropy)" in text
    far = [ar, point("mdm", "a", 900, 400), point("mdm", "b", 900, 300)]
    text = headline({0: far}, 64)
    assert "no setting is within 1.5x" in text and "the closest, b, has 300, 3.00x" in text
    assert "no setting of another family" in headline({0: [ar]}, 64)


def test_headline_refuses_without_the_ar_reference():
    points = [point("mdm", "a", 900, 110), point("ar", "ar T=0.7", 1000, 90)]
    with pytest.raises(ValueError, match="compares against the AR's 'ar T=1'"):
        headline({0: points}, 64)
    with pytest.raises(ValueError, match="not measured at that batch"):
        headline({0: [point("ar", "ar T=1", 1000, 100, batch=1)]}, 64)


def test_the_headline_applies_the_perplexity_bound_its_quoted_rule_states():
    # the ratio is read from the sentence the report quotes, so the rule's text and the rule
    # the headline applies cannot drift apart
    quoted = float(re.search(r"at most ([\d.]+)x the AR's", HEADLINE_RULE["text"])[1])
    ar = point("ar", "ar T=1", 1000, 80)
    points = [
        ar,
        point("ar", "ar T=0.7", 5000, 60),  # the AR's own settings are never candidates
        point("mdm", "at the bound", 400, quoted * 80),
        point("mdm", "just over", 900, quoted * 80 * (1 + 1e-9)),
        point("bd", "marked", 950, 70, repetition=CEILING * 2),
    ]
    assert names(passing_settings(points)) == ["at the bound"]
    assert "is at the bound, at 400 tokens/s" in headline({0: points}, 64)
    assert f"within {quoted:g}x of the AR's" in headline({0: points}, 64)
    assert passing_settings(points[1:]) == []  # no AR point at T=1: nothing to compare against


def test_points_from_the_compare_stages_take_the_fair_median():
    from eval.speed.throughput import Record, Spread, Throughput

    def record(name, batch, median):
        spread = Spread(median, median / 2, median * 2)
        tokens = [int(median)] * 3
        return Record(name, batch, 3, 1, spread, spread, [1.0, 2.0, 1.0], tokens, [0, 1, 2])

    sets = {
        "ar T=1": {"objective": "ar", "tokens_per_s": 1.0},  # the cold number is not used
        "mdm fixed": {"objective": "mdm"},
        "mdm unmeasured": {"objective": "mdm"},
        "unigram model": {"objective": "unigram"},
    }
    scores = {
        "ar T=1": {
            "judge_ppl": 600.0,
            "judge_ppl_ci95": [560.0, 680.0],
            "unigram_entropy": 3.8,
            "entropy_floor": 3.5,
            "repetition_rate_4gram": 0.02,
            "repetition_ceiling": 0.04,
        },
        "mdm fixed": {"judge_ppl": 130.0, "judge_ppl_ci95": None, "unigram_entropy": 2.8},
        "mdm unmeasured": {"judge_ppl": 100.0, "unigram_entropy": 3.8},
        "unigram model": {"judge_ppl": 2700.0, "unigram_entropy": 3.8},
    }
    measured = Throughput(
        [record("ar T=1", 64, 9000.0), record("mdm fixed", 64, 900.0), record("ar T=1", 1, 5.0)],
        {},
    )
    points = points_from_stages(sets, scores, measured, 64)
    assert points == [
        Point(
            "ar", "ar T=1", 64, 9000.0, 600.0, (560.0, 680.0), 3.8, 3.5, 0.02, 0.04,
            speed_ratios=((1.0,),),
        ),
        # bounds unknown; its ratio to the AR from the rounds they shared
        Point(
            "mdm", "mdm fixed", 64, 900.0, 130.0, None, 2.8,
            speed_ratios=((pytest.approx(0.1),),),
        ),
    ]  # fmt: skip
    # without the AR at a batch size there is no ratio
    alone = Throughput([record("mdm fixed", 64, 900.0)], {})
    assert points_from_stages(sets, scores, alone, 64)[0].speed_ratios == ()


def test_report_section_has_rule_headline_tables_and_figure(tmp_path):
    from eval.report import Report

    report = Report("frontier", tmp_path)
    runs = {
        0: [point("ar", "ar T=1", 1000, 100), measured(point("mdm", "m", 500, 120), (0.5, 0.5))],
        1: [
            point("ar", "ar T=1", 1000, 100),
            measured(point("mdm", "m", 700, 130), (0.6, 0.8)),
            point("mdm", "m", 9, 9, batch=1),  # no AR at batch 1: no headline there
        ],
    }
    results = report_frontier(report, runs)
    paths = report.write()
    text = paths["markdown"].read_text()
    assert HEADLINE_RULE["text"] in text
    assert "**Batch 64.** At batch 64, the fastest setting" in text and "over 2 seeds" in text
    assert "**Batch 1.** No headline: no headline at batch 1" in text
    assert (tmp_path / "frontier_batch64.png").is_file()
    assert results["batch 64"]["front_unmarked"] == ["ar T=1"]
    assert results["batch 64"]["points"][1]["tokens_per_s"] == 600.0
    # report.json keeps what each seed measured and the per-seed ratios behind the interval
    per_seed = results["batch 64"]["per_seed"]
    assert per_seed["headline_setting"] == "m"
    assert per_seed["headline_ratios"] == [[0.5, 0.5], [0.6, 0.8]]
    # the geometric mean over the seeds of each seed's geometric mean over its processes
    assert per_seed["headline_ratio"]["mean"] == pytest.approx(math.sqrt(0.5 * math.sqrt(0.48)))
    assert per_seed["headline_ratio"]["over"] == "seeds"
    assert [p["tokens_per_s"] for p in per_seed["points"]["1"]] == [1000, 700]


def test_headline_lists_ties_in_quality():
    points = [
        point("ar", "ar T=1", 1000, 100, ci=(90, 110)),
        point("mdm", "fast", 3000, 140, ci=(120, 160)),
        point("mdm", "tied", 2000, 125, ci=(115, 135)),  # overlaps "fast": tied in quality
        point("mdm", "separate", 1500, 101, ci=(99, 103)),  # clearly better: not tied
    ]
    text = headline({0: points}, 64)
    assert "is fast, at 3,000 tokens/s" in text
    assert text.endswith(
        "Tied with it in quality (overlapping perplexity intervals): tied (2,000 tokens/s)."
    )
    no_interval = [point("ar", "ar T=1", 1000, 100), point("mdm", "m", 900, 110)]
    assert "ties in quality not assessed" in headline({0: no_interval}, 64)


def test_seed_means_span_the_intervals_and_unknown_stays_unknown():
    runs = {
        0: [point("mdm", "m", 100, 10, ci=(9, 11), entropy=3.8)],
        1: [point("mdm", "m", 300, 20, ci=(18, 23), entropy=None)],
    }
    (mean,) = seed_means(runs, 64)
    assert (mean.tokens_per_s, mean.judge_ppl, mean.judge_ppl_ci95) == (200, 15, (9, 23))
    assert mean.entropy is None and mark(mean) == UNKNOWN


def test_held_out_bounds_by_hand():
    from eval.sample_sets import HELD_OUT_WINDOWS, HeldOutText

    # a stream of period 4: every window of 2 tokens holds two different tokens (entropy
    # log 2, no spread), every window of 1 token has entropy 0
    held_out = HeldOutText([1, 2, 3, 4] * 100, decode=lambda ids: " ".join(map(str, ids)))
    assert len(held_out.windows(2)) == HELD_OUT_WINDOWS
    bounds = held_out.bounds([2, 2, 1])
    assert bounds["held_out_entropy"] == pytest.approx(2 * math.log(2) / 3)
    assert bounds["entropy_floor"] == pytest.approx(bounds["held_out_entropy"])  # no spread
    assert bounds["repetition_ceiling"] == 0.0
    # windows whose entropies spread: the floor sits 1.96 standard errors of the set below
    spread = HeldOutText([1, 1, 2, 3] * 100, decode=str)
    stats = spread.stats(2)
    floor = spread.bounds([2] * 4)["entropy_floor"]
    assert floor == pytest.approx(stats[0] - 1.959964 * math.sqrt(stats[1] / 4))
    # a smaller set is held to the bound of the report's set size, not a wider one of its own
    assert spread.bounds([2] * 2, set_size=4)["entropy_floor"] == pytest.approx(floor)
    assert spread.bounds([2] * 2)["entropy_floor"] < floor
    with pytest.raises(ValueError, match="held-out text is empty"):
        HeldOutText([], decode=str)
