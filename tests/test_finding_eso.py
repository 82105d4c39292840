"""The eso-alpha-0 finding: its order rule on constructed losses (each verdict reachable), the
learned gate, and the runs it registers."""

from eval.findings import eso_alpha
from eval.findings.verdicts import INCONCLUSIVE, NOT_REPRODUCED, NOT_TRAINED, REPRODUCED

SETTINGS = eso_alpha.EsoSettings((0, 1, 2), "smoke", (1.0, 0.5, 0.25))


def losses(high=(4.6, 4.62, 4.61), middle=(4.4, 4.41, 4.43), low=(4.2, 4.22, 4.21)) -> dict:
    return {
        seed: {"ar": 3.9, "mdm": 4.5, "eso-1": high[seed], "eso-0.5": middle[seed]}
        | {"eso-0.25": low[seed]}
        for seed in range(3)
    }


def verdict(trained: dict, tmp_path, unigram: float = 5.0) -> str:
    return eso_alpha.judge("smoke", SETTINGS, trained, unigram, tmp_path).verdict


def test_every_step_down_lowering_the_nelbo_reproduces(tmp_path):
    assert verdict(losses(), tmp_path) == REPRODUCED


def test_a_step_that_raises_the_nelbo_does_not_reproduce(tmp_path):
    assert verdict(losses(low=(4.6, 4.61, 4.62)), tmp_path) == NOT_REPRODUCED


def test_a_step_within_the_seeds_noise_is_inconclusive(tmp_path):
    assert verdict(losses(low=(4.5, 4.3, 4.42)), tmp_path) == INCONCLUSIVE


def test_a_run_on_its_unigram_plateau_is_not_trained(tmp_path):
    # the losses reproduce the order, but the alpha_0 = 1 runs sit on the plateau (5.0 - 0.1)
    assert verdict(losses(high=(4.95, 4.95, 4.96)), tmp_path) == NOT_TRAINED
    # the references are context: an MDM on its plateau leaves the verdict
    trained = losses()
    for per_seed in trained.values():
        per_seed["mdm"] = 4.99
    assert verdict(trained, tmp_path) == REPRODUCED


def test_the_runs_it_registers_differ_only_by_objective_and_alpha_0():
    runs = eso_alpha.runs(SETTINGS)
    assert sorted(runs)[:5] == [
        "seed-0/ar",
        "seed-0/eso-0.25",
        "seed-0/eso-0.5",
        "seed-0/eso-1",
        "seed-0/mdm",
    ]
    eso = {name: start for name, (_, start) in runs.items() if "eso" in name}
    assert {start["alpha_0"] for start in eso.values()} == {1.0, 0.5, 0.25}
    assert all(start["objective"] == "eso" for start in eso.values())
