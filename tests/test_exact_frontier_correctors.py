"""The exact frontier's corrector and EB questions (eval.experiments.exact_frontier_correctors)
and its new settings: the seed-paired verdict rule says "lowers" only when the whole interval is
below 0, "from how many steps" needs every larger step count to lower, EB is paired with the
threshold setting of nearest NFE, and every setting's sampler config is valid (the loop's eta at
its bound, Eso's NFE counting both phases)."""

import pytest

from eval.experiments.exact_frontier_correctors import (
    corrector_summary,
    corrector_verdicts,
    eb_rows,
    from_steps,
    verdict,
)
from eval.experiments.exact_frontier_setup import (
    CORRECTED_STEPS,
    CORRECTOR_ETA,
    GEN_LENGTH,
    LOOP_TIMES,
    SamplerSetting,
    corrector_settings,
    is_positive_control,
    loop_eta,
    sampler_settings,
    spread_of,
)


def frontier_row(family, sampler, steps, trained, exact=0.1, nfe=None):
    return {
        "family": family,
        "sampler_rule": sampler,
        "steps": steps,
        "setting": f"{family} {sampler} {steps}",
        "total_tv": trained,
        "trained": spread_of(trained),
        "sampler": {"mean": exact},
        "nfe_per_token": steps / GEN_LENGTH if nfe is None else nfe,
        "exact_nfe_per_token": None,
    }


def test_verdict_needs_the_whole_interval_on_one_side() -> None:
    assert verdict(spread_of([-0.03, -0.02, -0.025])) == "lowers"
    assert verdict(spread_of([0.03, 0.02, 0.025])) == "raises"
    assert verdict(spread_of([-0.05, 0.01, -0.02])) == "not separated"
    assert verdict(spread_of([-0.5])) == "not separated"  # one seed: no interval, no verdict


def test_corrector_pairs_by_seed_at_the_same_steps() -> None:
    # the plain sampler's seeds differ widely, the corrector is higher on every seed by about
    # 0.01 at 3 steps and lower from 5 on: only a seed-paired difference can see it
    plain = [0.2, 0.5, 0.8]
    rows = []
    for steps in CORRECTED_STEPS:
        shift = -0.01 if steps >= 5 else 0.01
        rows.append(frontier_row("mdm", "ancestral", steps, plain, exact=0.2))
        better = [p + shift + 0.001 * k for k, p in enumerate(plain)]
        rows.append(frontier_row("mdm", "remdm-cap", steps, better, exact=0.2 + shift))
    verdicts = corrector_verdicts(rows)
    assert [v["steps"] for v in verdicts] == list(CORRECTED_STEPS)  # only the pairs present
    by_steps = {v["steps"]: v for v in verdicts}
    assert by_steps[3]["verdict"] == "raises" and by_steps[10]["verdict"] == "lowers"
    assert by_steps[10]["exact_verdict"] == "lowers" and by_steps[3]["exact_verdict"] == "raises"
    summary = corrector_summary(verdicts)["mdm remdm-cap"]
    assert summary["from_steps"] == 5 and summary["exact_from_steps"] == 5


def test_from_steps_is_none_unless_the_largest_lowers() -> None:
    entries = [{"steps": 3, "verdict": "lowers"}, {"steps": 10, "verdict": "not separated"}]
    assert from_steps(entries) is None
    entries[1]["verdict"] = "lowers"
    assert from_steps(entries) == 3


def test_eb_is_paired_with_the_threshold_of_nearest_nfe() -> None:
    rows = [
        frontier_row("mdm", "eb", None, [0.3, 0.4, 0.5], nfe=0.5),
        frontier_row("mdm", "threshold", None, [0.2, 0.3, 0.4], nfe=0.9),
        frontier_row("mdm", "threshold", None, [0.1, 0.2, 0.3], nfe=0.45),
    ]
    rows[2]["setting"] = "nearest"
    (placed,) = eb_rows(rows)
    assert placed["threshold"] == "nearest"
    assert placed["difference"]["trained"]["mean"] == pytest.approx(0.2)


def test_every_setting_has_a_valid_config_and_the_loop_its_bound() -> None:
    for setting in sampler_settings():
        config = setting.config()
        if hasattr(config, "validate"):
            config.validate()
    alpha_on = LOOP_TIMES["alpha_on"]
    # the smaller of CORRECTOR_ETA and the loop's bound: ReMDM's (1 - a) / a is above it,
    # Psi's 1 - a equals it up to float rounding, which the sampler's check admits
    assert loop_eta("mdm") == CORRECTOR_ETA < (1 - alpha_on) / alpha_on
    assert loop_eta("udm") == pytest.approx(1 - alpha_on, abs=1e-12)
    assert {s.sampler for s in corrector_settings()} >= {"remdm-loop", "psi-loop", "psi-cap"}


def test_eso_nfe_counts_its_chunks_and_its_autoregressive_tokens() -> None:
    # alpha_0 = 0.5 of 5 positions: round(2.5) = 2 diffused in 1 call, then 3 AR calls
    assert SamplerSetting("eso", "alpha_0", 1, 0.5).nfe_per_token == pytest.approx(4 / 5)
    assert SamplerSetting("eso", "alpha_0", 3, 1.0).nfe_per_token == pytest.approx(3 / 5)
    assert SamplerSetting("eso", "alpha_0", 1, 0.0).nfe_per_token == 1.0
    assert SamplerSetting("mdm", "eb", None, 0.5).nfe_per_token is None
    eso_controls = {s.name for s in sampler_settings() if s.family == "eso"}
    controls = {s.name for s in sampler_settings() if is_positive_control(s)}
    assert {"eso alpha_0 1 5 steps", "eso alpha_0 0 1 steps"} <= controls
    assert "eso alpha_0 1 3 steps" in eso_controls - controls
