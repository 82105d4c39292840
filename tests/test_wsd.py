"""The warmup-stable-decay schedule and its cooldown branches: hand-computed rates, and a branch
off a longer run's checkpoint that is bit for bit the run scheduled for its budget."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from shared.checkpoint import checkpoint_name, list_checkpoints
from shared.errors import ConfigError
from shared.training import new_run, resume_run, train
from shared.training.config import TrainConfig
from shared.training.schedule import (
    branch_points,
    check_cooldown,
    cooldown_start,
    lr_multiplier,
    schedules_agree,
)


def wsd(step: int, total: int = 20) -> float:
    return lr_multiplier(
        step,
        warmup_steps=4,
        total_steps=total,
        schedule="wsd",
        min_lr_ratio=0.1,
        cooldown_fraction=0.25,
    )


def test_wsd_rates_by_hand():
    # 20 steps, the last 5 decay: warmup 1/4..4/4, stable to step 14, then 1 - 0.9 * k/5.
    assert [wsd(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert all(wsd(s) == 1.0 for s in range(4, 15))
    expected = [1 - 0.9 * k / 5 for k in range(1, 6)]
    assert [wsd(s) for s in range(15, 20)] == pytest.approx(expected, abs=1e-15)
    assert wsd(19) == pytest.approx(0.1)


def test_cooldown_start_and_agreement():
    assert cooldown_start(20, 0.25) == 15
    assert cooldown_start(800, 0.2) == 640
    assert cooldown_start(3, 0.01) == 2  # at least one step decays
    cfg = TrainConfig(lr_schedule="wsd", warmup_steps=4, cooldown_fraction=0.25)
    # A 20-step run's first 15 rates are those of any longer run; its 16th is not.
    assert schedules_agree(cfg, 20, 80, 15)
    assert not schedules_agree(cfg, 20, 80, 16)
    cosine = TrainConfig(warmup_steps=4)
    assert not schedules_agree(cosine, 20, 80, 6)
    assert schedules_agree(cosine, 20, 80, 4)  # the warmups agree


def test_a_cooldown_that_starts_inside_warmup_is_refused():
    cfg = TrainConfig(lr_schedule="wsd", warmup_steps=30, cooldown_fraction=0.2)
    check_cooldown(cfg, 40)  # cooldown from step 32
    with pytest.raises(ConfigError, match="starts its cooldown at step 24, inside its warmup"):
        check_cooldown(cfg, 30)
    with pytest.raises(ConfigError, match="cooldown_fraction=0.0 must be in"):
        TrainConfig(lr_schedule="wsd", cooldown_fraction=0.0).validate()


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(list_checkpoints(out / "checkpoints")[-1] / "model.safetensors"))


# Validation every 5 steps, as the main job validates its trunks and branches periodically
# (eval_every below the budgets): validations before and after the branch point (step 18) and
# inside the cooldown must leave the branch bit for bit the straight run.
SCHEDULE = dict(
    lr_schedule="wsd", warmup_steps=4, cooldown_fraction=0.25, eval_every=5, keep_checkpoints=20
)


@pytest.mark.parametrize("objective", ["ar", "mdm"])
def test_a_cooldown_branch_is_the_run_scheduled_for_its_budget(objective, tmp_path):
    cache = str(tmp_path / "cache")
    common = dict(objective=objective, cache_dir=cache, **SCHEDULE)
    straight = train(new_run("tiny", tmp_path / "straight", max_steps=24, **common))
    # A 48-step trunk keeps a checkpoint where a 24-step run's cooldown starts (step 18), however
    # few checkpoints it keeps otherwise.
    trunk = new_run("tiny", tmp_path / "trunk", max_steps=48, branch_budgets="12,24", **common)
    train(dataclasses.replace(trunk, train=dataclasses.replace(trunk.train, keep_checkpoints=1)))
    kept = [p.name for p in list_checkpoints(tmp_path / "trunk" / "checkpoints")]
    # the branch points and the newest (periodic validation also keeps the best one)
    assert {"step_000009", "step_000018"} <= set(kept) and kept[-1] == "step_000048"
    point = tmp_path / "trunk" / "checkpoints" / checkpoint_name(cooldown_start(24, 0.25))
    branch = train(resume_run(point, tmp_path / "branch", max_steps=24))
    assert branch["finished"] and branch["step"] == 24
    assert branch["schedule_history"] == [{"from_step": 0, "total_steps": 24}]
    assert branch["branched_from"] == str(point)
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "branch")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert branch["val_nats_per_token"] == straight["val_nats_per_token"]
    # The trunk itself is untouched by its branch.
    assert json.loads((tmp_path / "trunk" / "final.json").read_text())["step"] == 48


def test_a_branch_from_inside_a_cooldown_records_two_schedules(tmp_path):
    cache = str(tmp_path / "cache")
    train(
        new_run(
            "tiny",
            tmp_path / "short",
            max_steps=24,
            checkpoint_every=4,
            cache_dir=cache,
            **SCHEDULE,
        )
    )
    # Step 20 of the 24-step run is in its cooldown: a 48-step run never took those rates.
    point = tmp_path / "short" / "checkpoints" / checkpoint_name(20)
    longer = train(resume_run(point, tmp_path / "longer", max_steps=48))
    assert longer["schedule_history"] == [
        {"from_step": 0, "total_steps": 24},
        {"from_step": 20, "total_steps": 48},
    ]


def test_branch_budgets_are_checked():
    with pytest.raises(ConfigError, match="needs lr_schedule='wsd'"):
        TrainConfig(branch_budgets="10,20").validate()
    with pytest.raises(ConfigError, match="must be below this run's 20 steps"):
        TrainConfig(lr_schedule="wsd", max_steps=20, branch_budgets="10,20").validate()
    with pytest.raises(ConfigError, match="positive and strictly increasing"):
        TrainConfig(lr_schedule="wsd", branch_budgets="20,10").validate()
    with pytest.raises(ConfigError, match="step counts separated by commas"):
        TrainConfig(lr_schedule="wsd", branch_budgets="10;20").validate()
    # a branch budget whose own cooldown would start inside the warmup
    cfg = TrainConfig(lr_schedule="wsd", warmup_steps=30, max_steps=400, branch_budgets="30,200")
    with pytest.raises(ConfigError, match="inside its warmup of 30"):
        branch_points(cfg.validate(), 400)
    assert branch_points(dataclasses.replace(cfg, branch_budgets="50,200"), 400) == {40, 160}
