"""Pre-registration of findings: the hash of settings and rule, the registry with its history,
the pre-registered/exploratory label, and job folders never reused across a change."""

import json
import subprocess
from dataclasses import dataclass, replace

import pytest

from eval.findings import register, registration
from eval.findings.common import Claim
from eval.findings.registry import FINDINGS


@dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...]
    steps: int


@dataclass(frozen=True)
class Toy:
    name: str
    claim: Claim
    settings: dict
    rule: dict


def toy(steps: int = 100, band: tuple = (8, 32)) -> Toy:
    claim = Claim("toy", "a toy claim", "nobody")
    return Toy("toy", claim, {"cpu": Settings((0, 1, 2), steps)}, {"band": list(band)})


CLEAN = {"git_dirty": False}


def test_hash_covers_settings_rule_and_claim():
    base = registration.registration_hash(toy(), "cpu")
    assert base == registration.registration_hash(toy(), "cpu")
    assert base != registration.registration_hash(toy(steps=101), "cpu")
    assert base != registration.registration_hash(toy(band=(8, 33)), "cpu")
    other_claim = replace(toy(), claim=Claim("toy", "another claim", "nobody"))
    assert base != registration.registration_hash(other_claim, "cpu")


def test_registration_status_and_history(tmp_path):
    path = tmp_path / "registered.json"
    findings = {"toy": toy()}
    status = registration.registration(toy(), "cpu", CLEAN, registry={})
    assert status["status"] == registration.EXPLORATORY and "nothing is registered" in status["why"]
    assert registration.register(findings, "first", path) == ["toy/cpu"]
    registry = registration.load_registry(path)
    status = registration.registration(toy(), "cpu", CLEAN, registry)
    assert status["status"] == registration.PRE_REGISTERED and status["revisions"] == 0
    assert "Pre-registered" in registration.registration_text(status)
    # uncommitted code: exploratory even with the registered settings
    dirty = registration.registration(toy(), "cpu", {"git_dirty": True}, registry)
    assert dirty["status"] == registration.EXPLORATORY and "uncommitted" in dirty["why"]
    # settings changed after the registration: exploratory until registered again
    changed = registration.registration(toy(steps=200), "cpu", CLEAN, registry)
    assert changed["status"] == registration.EXPLORATORY and "differ" in changed["why"]
    assert registration.register({"toy": toy(steps=200)}, "longer runs", path) == ["toy/cpu"]
    registry = registration.load_registry(path)
    again = registration.registration(toy(steps=200), "cpu", CLEAN, registry)
    assert again["status"] == registration.PRE_REGISTERED and again["revisions"] == 1
    assert registry["toy"]["cpu"]["history"][0]["replaced_because"] == "longer runs"
    assert "longer runs" in registration.registration_text(again)
    # nothing stale: nothing changes
    assert registration.register({"toy": toy(steps=200)}, "again", path) == []


@dataclass(frozen=True)
class Trained(Toy):
    """A toy that trains one run of a preset, with ``overrides``."""

    overrides: tuple = ()

    def runs(self, settings):
        return {"a": ("demo", dict(self.overrides))}


def trained(**overrides) -> Trained:
    base = toy()
    return Trained(base.name, base.claim, base.settings, base.rule, tuple(overrides.items()))


def test_the_hash_covers_the_precision_as_it_resolves(monkeypatch, tmp_path):
    # the demo preset trains with precision="auto": bf16 with AMX, fp32 without
    bf16 = registration.registration_hash(trained(), "cpu", {"precision": "bf16"})
    fp32 = registration.registration_hash(trained(), "cpu", {"precision": "fp32"})
    assert bf16 != fp32
    explicit = trained(precision="fp32")  # a set precision is the same on every machine
    assert registration.registration_hash(
        explicit, "cpu", {"precision": "bf16"}
    ) == registration.registration_hash(explicit, "cpu", {"precision": "fp32"})
    # registered on a machine without AMX ...
    path = tmp_path / "registered.json"
    monkeypatch.setattr(registration, "bf16_is_fast", lambda: False)
    assert registration.register({"toy": trained()}, "first", path) == ["toy/cpu"]
    registry = registration.load_registry(path)
    assert registry["toy"]["cpu"]["resolved"] == {"precision": "fp32"}
    status = registration.registration(trained(), "cpu", CLEAN, registry)
    assert status["status"] == registration.PRE_REGISTERED
    assert "(resolved: precision fp32)" in registration.registration_text(status)
    # ... and run on one with AMX: not the registered run, and the label says why
    monkeypatch.setattr(registration, "bf16_is_fast", lambda: True)
    status = registration.registration(trained(), "cpu", CLEAN, registry)
    assert status["status"] == registration.EXPLORATORY
    assert "precision bf16 here, fp32 when registered" in status["why"]
    # the registry itself is judged with the resolution it recorded: not stale on this machine
    assert registration.stale_entries({"toy": trained()}, registry) == []
    # a changed setting on this machine is still a changed setting, not a resolution
    longer = replace(trained(), settings={"cpu": Settings((0, 1, 2), 200)})
    status = registration.registration(longer, "cpu", CLEAN, registry)
    assert "differ from those registered" in status["why"]
    # an entry registered before resolutions were recorded is stale
    del registry["toy"]["cpu"]["resolved"]
    assert registration.stale_entries({"toy": trained()}, registry) == [("toy", "cpu")]


def test_every_finding_is_registered_as_it_is_now():
    """A change to a finding's settings, rule or claim must be registered (a commit) before its
    verdict runs: ``python -m eval.findings.register --because "..."``."""
    stale = registration.stale_entries(FINDINGS, registration.load_registry())
    assert stale == [], f"register these first: {stale}"


def test_job_folder_is_moved_aside_when_code_or_settings_change(tmp_path, capsys):
    out = tmp_path / "finding"
    stamp = {"source_hash": "a", "registration": "x"}
    registration.fresh_job_folder(out, stamp, force=False)
    (out / "trained.txt").write_text("kept")
    registration.fresh_job_folder(out, stamp, force=False)  # the same code and settings: reused
    assert (out / "trained.txt").exists()
    # another commit of the same source and settings: reused, its stamp keeps the runs' commit
    registration.fresh_job_folder(out, stamp | {"git_commit": "later"}, force=False)
    assert (out / "trained.txt").exists()
    assert "git_commit" not in json.loads((out / registration.JOB_STAMP).read_text())
    registration.fresh_job_folder(out, stamp | {"source_hash": "b"}, force=False)
    assert not (out / "trained.txt").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("finding.replaced-")]
    assert len(aside) == 1 and (aside[0] / "trained.txt").read_text() == "kept"
    assert "other code or settings" in capsys.readouterr().out
    assert json.loads((out / registration.JOB_STAMP).read_text())["source_hash"] == "b"


@pytest.mark.parametrize("argv, code", [([], 0), (["--only", "reversal"], 0)])
def test_registration_command_reports_stale_entries(argv, code, capsys):
    assert register.main(argv) == code
    assert "every entry is registered" in capsys.readouterr().out


# ---- everything that decides a verdict is in the hash --------------------------------------------


@dataclass(frozen=True)
class Runs:
    """A toy finding that trains runs and is judged by a module of its own."""

    name: str
    claim: Claim
    settings: dict
    rule: dict
    runs: object
    judged_by: tuple


def runs_toy(judge_module: str, dataset: str = "synthetic:facts?pairs=4&both=2&n=50") -> Runs:
    def runs(settings: Settings) -> dict:
        over = {"max_steps": settings.steps, "dataset": dataset, "tokenizer": "byte"}
        return {"ar": ("tiny", over | {"objective": "ar"})}

    claim = Claim("toy", "a toy claim", "nobody")
    settings = {"cpu": Settings((0, 1), 10)}
    return Runs("toy", claim, settings, {"band": [8, 32]}, runs, (judge_module,))


@pytest.fixture
def judged(tmp_path, monkeypatch):
    """A registered toy finding whose verdict code is a module in ``tmp_path``."""
    module = tmp_path / "toy_judge.py"
    module.write_text("THRESHOLD = 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "registered.json"
    registration.register({"toy": runs_toy("toy_judge")}, "first", path)
    return module, registration.load_registry(path)


def status_of(finding, registry) -> str:
    return registration.registration(finding, "cpu", CLEAN, registry)["status"]


def test_registered_toy_is_pre_registered(judged):
    _, registry = judged
    assert status_of(runs_toy("toy_judge"), registry) == registration.PRE_REGISTERED


def test_an_edited_judging_module_makes_a_run_exploratory(judged):
    module, registry = judged
    module.write_text("THRESHOLD = 0.4\n")  # the finding's own verdict code edited
    assert status_of(runs_toy("toy_judge"), registry) == registration.EXPLORATORY


@pytest.mark.parametrize("shared", ["eval.findings.verdicts", "eval.findings.common"])
def test_edited_shared_verdict_code_makes_a_run_exploratory(judged, monkeypatch, shared):
    _, registry = judged
    original = registration.module_text
    monkeypatch.setattr(
        registration,
        "module_text",
        lambda name: original(name) + ("\n# edited\n" if name == shared else ""),
    )
    assert status_of(runs_toy("toy_judge"), registry) == registration.EXPLORATORY


def test_an_edited_preset_makes_a_run_exploratory(judged, monkeypatch):
    """The preset a run names is expanded: editing the preset, not the finding, is a change."""
    from shared.training import presets

    _, registry = judged
    tiny = presets.get_preset("tiny")
    edited = tiny | {"train": tiny["train"] | {"lr": tiny["train"]["lr"] * 2}}
    monkeypatch.setitem(presets.PRESETS, "tiny", edited)
    assert status_of(runs_toy("toy_judge"), registry) == registration.EXPLORATORY


def test_another_data_spec_makes_a_run_exploratory(judged):
    _, registry = judged
    other = runs_toy("toy_judge", dataset="synthetic:facts?pairs=4&both=2&n=60")
    assert status_of(other, registry) == registration.EXPLORATORY


def test_an_untracked_file_makes_the_tree_dirty_an_ignored_one_does_not(tmp_path):
    from eval.provenance import code_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "train.py").write_text("")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    assert code_state(tmp_path)["git_dirty"] is False
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "out.json").write_text("{}")  # ignored: still clean
    assert code_state(tmp_path)["git_dirty"] is False
    (tmp_path / "new_module.py").write_text("X = 1\n")  # a new module a finding could import
    assert code_state(tmp_path)["git_dirty"] is True


def test_an_option_added_off_by_default_leaves_registrations_as_they_were(judged, monkeypatch):
    """A new training option at its off value changes no registration; set, it does."""
    import dataclasses

    from shared.training import config as train_config

    _, registry = judged
    original = train_config.TrainConfig
    grown = dataclasses.make_dataclass(
        "TrainConfig", [("a_new_option", int, 0)], bases=(original,), frozen=True
    )
    resolve = registration.resolve_config

    def resolve_with(option: int):
        def resolved(preset, overrides):
            model, train = resolve(preset, overrides)
            return model, grown(**dataclasses.asdict(train), a_new_option=option)

        return resolved

    monkeypatch.setattr(registration, "resolve_config", resolve_with(0))
    assert status_of(runs_toy("toy_judge"), registry) == registration.PRE_REGISTERED
    monkeypatch.setattr(registration, "resolve_config", resolve_with(3))
    assert status_of(runs_toy("toy_judge"), registry) == registration.EXPLORATORY
