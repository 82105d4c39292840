"""The remdm-steps finding: its two-part rule on constructed sample sets (each verdict
reachable: both parts at every T reproduce, a reversed MAUVE refutes, a perplexity bought with
repetition or one seed's noise is inconclusive), the learned gate, and the run it registers."""

from eval.findings import remdm_steps
from eval.findings.verdicts import INCONCLUSIVE, NOT_REPRODUCED, NOT_TRAINED, REPRODUCED

SETTINGS = remdm_steps.RemdmSettings((0, 1, 2), "smoke", 6, 16, (1, 2))
NAMES = list(remdm_steps.samplers(SETTINGS))


def judged_set(name: str, log_ppl: float, entropy: float = 4.0) -> dict:
    return {
        "model": "ReMDM" if "ReMDM" in name else "ancestral",
        "steps": int(name.split("T=")[1]),
        "nfe": 16,
        "log_ppl": {"value": log_ppl, "low": log_ppl - 0.05, "high": log_ppl + 0.05},
        "unigram_entropy": entropy,
        "mean_length": 16.0,
        "empty_share": 0.0,
        "repetition_rate_4gram": 0.0,
        "samples": 18,
    }


def verdict(tmp_path, remdm_ppl=5.0, remdm_entropy=4.0, mauve_shift=0.1, finals=(4.0,) * 3):
    sets = {
        name: judged_set(name, remdm_ppl, remdm_entropy)
        if "ReMDM" in name
        else judged_set(name, 5.5)
        for name in NAMES
    }
    mauve = {
        seed: {
            name: 0.3 + 0.1 * seed + (mauve_shift + 0.01 * seed if "ReMDM" in name else 0.0)
            for name in NAMES
        }
        for seed in SETTINGS.seeds
    }
    learned = {"unigram": 5.0, "finals": dict(zip(SETTINGS.seeds, finals))}
    judged = {"judge": "test judge", "sets": sets}
    return remdm_steps.judge("smoke", SETTINGS, judged, mauve, learned, tmp_path).verdict


def test_better_perplexity_and_mauve_at_every_t_reproduces(tmp_path):
    assert verdict(tmp_path) == REPRODUCED


def test_a_lower_mauve_in_every_seed_does_not_reproduce(tmp_path):
    assert verdict(tmp_path, mauve_shift=-0.1) == NOT_REPRODUCED


def test_perplexity_bought_with_lower_entropy_is_inconclusive(tmp_path):
    # ReMDM's perplexity is lower, but its samples' entropy is 10% below ancestral's
    assert verdict(tmp_path, remdm_entropy=3.6) == INCONCLUSIVE


def test_a_mauve_difference_within_the_seeds_noise_is_inconclusive(tmp_path):
    assert remdm_steps.mauve_verdict(remdm_steps.paired_difference([0.3, 0.1], [0.2, 0.2])) == (
        INCONCLUSIVE
    )


def test_a_model_on_its_unigram_plateau_is_not_trained(tmp_path):
    assert verdict(tmp_path, finals=(4.0, 4.95, 4.0)) == NOT_TRAINED


def test_the_samplers_are_ancestral_and_remdms_loop_at_each_multiple_of_l():
    sampled = remdm_steps.samplers(SETTINGS)
    assert sorted(steps for _, steps, _ in sampled.values()) == [16, 16, 32, 32]
    loops = [config.strategy for kind, _, config in sampled.values() if kind == "ReMDM"]
    assert all(r.mode == "loop" and r.eta == 0.02 and r.alpha_on == 0.9 for r in loops)
    runs = remdm_steps.runs(SETTINGS)
    assert sorted(runs) == ["seed-0/mdm", "seed-1/mdm", "seed-2/mdm"]
    assert all(start["objective"] == "mdm" for _, start in runs.values())
