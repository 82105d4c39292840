"""Pre-registration of findings: the hash of settings and rule, the registry with its history,
the pre-registered/exploratory label, and job folders never reused across a change."""

import json
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
