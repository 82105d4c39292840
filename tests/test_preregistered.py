"""Whether a registration came before its result, checked from git (eval/findings/preregistered.py)
on constructed histories in a temporary repository: registered before -> pre-registered; after ->
says so; a registration never committed, one outside the result's history, and no git at all
each get their own label; an index's labels are recomputed from that history when it is written
and when its table is printed, never copied."""

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime

import pytest

from eval.findings.__main__ import checked_labels
from eval.findings.common import Claim, FindingResult
from eval.findings.index import write_index
from eval.findings.preregistered import (
    AFTER_THE_RESULT,
    NOT_CHECKED,
    NOT_COMMITTED,
    NOT_IN_HISTORY,
    PRE_REGISTERED,
    REGISTRY_PATH,
    check,
    registration_commit,
    result_label,
)

HASH, OTHER = "0123abcd4567ef89", "fedcba9876543210"


def at(day: int, hour: int = 12) -> datetime:
    return datetime(2026, 12, day, hour, tzinfo=UTC)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """An empty repository whose commits take the dates a test gives them."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the constructed histories need it")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "repo"
    root.mkdir()

    def run(*args, when=None):
        env = dict(os.environ)
        if when is not None:
            env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = when.isoformat()
        done = subprocess.run(
            ["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True
        )
        return done.stdout.strip()

    run("init", "-q", "-b", "main")
    run("config", "user.email", "t@example.com")
    run("config", "user.name", "t")
    return root, run


def commit_registry(root, run, hashes, when, message="register"):
    path = root / REGISTRY_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"toy": {"cpu": {"hash": hashes[0], "history": hashes[1:]}}}))
    run("add", "-A")
    run("commit", "-q", "-m", message, when=when)
    return run("rev-parse", "HEAD")


def commit_result(root, run, when):
    (root / "report.md").write_text(f"result at {when}")
    run("add", "-A")
    run("commit", "-q", "-m", "result", when=when)
    return run("rev-parse", "HEAD")


def test_registered_before_the_run_is_pre_registered(repo):
    root, run = repo
    registered = commit_registry(root, run, [HASH], at(1))
    result = commit_result(root, run, at(3))
    found = check(root, HASH, result, started=at(2))
    assert found.label == PRE_REGISTERED and found.registration_commit == registered
    assert found.registered_at == at(1) and "before the run started" in found.why


def test_registered_after_the_run_started_says_so(repo):
    root, run = repo
    commit_registry(root, run, [OTHER], at(1))
    # the run started on day 2 under nothing registered; its hash was registered on day 3
    registered = commit_registry(root, run, [HASH, OTHER], at(3), "register after the fact")
    result = commit_result(root, run, at(4))
    found = check(root, HASH, result, started=at(2))
    assert found.label == AFTER_THE_RESULT and found.registration_commit == registered
    assert "after the run started" in found.why
    # a re-registration keeps the old hash in history: the old result stays checked against the
    # commit that first added it
    assert registration_commit(root, OTHER)[1] == at(1)
    assert check(root, OTHER, result, started=at(2)).label == PRE_REGISTERED


def test_a_registration_never_committed_or_outside_the_history(repo):
    root, run = repo
    commit_registry(root, run, [OTHER], at(1))
    result = commit_result(root, run, at(3))
    assert check(root, HASH, result, started=at(2)).label == NOT_COMMITTED
    # registered on a branch the result's commit does not contain
    run("checkout", "-q", "-b", "side")
    commit_registry(root, run, [HASH, OTHER], at(1, 18))
    run("checkout", "-q", "main")
    found = check(root, HASH, result, started=at(2))
    assert found.label == NOT_IN_HISTORY and "not in the history" in found.why
    assert check(root, OTHER, None, started=at(2)).label == NOT_IN_HISTORY


def test_a_draft_branch_registration_does_not_hide_the_one_in_the_results_history(repo):
    """The hash first committed on a draft branch that never merged; registered again on main
    before the run: main's registration is the one that counts."""
    root, run = repo
    commit_registry(root, run, [OTHER], at(1))
    run("checkout", "-q", "-b", "draft")
    commit_registry(root, run, [HASH, OTHER], at(1, 14), "draft registration")
    run("checkout", "-q", "main")
    on_main = commit_registry(root, run, [HASH, OTHER], at(2, 9), "registration on main")
    result = commit_result(root, run, at(3))
    found = check(root, HASH, result, started=at(2, 12))
    assert found.label == PRE_REGISTERED and found.registration_commit == on_main


@pytest.mark.parametrize("commit", ["HEAD", "--all", "main; rm -rf /", "abc123", "g" * 40])
def test_a_result_commit_that_is_not_40_hex_digits_is_never_given_to_git(repo, commit):
    root, run = repo
    commit_registry(root, run, [HASH], at(1))
    found = check(root, HASH, commit, started=at(2))
    assert found.label == NOT_IN_HISTORY and "40 hex digits" in found.why


def test_without_git_it_says_it_could_not_check(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    found = check(tmp_path, HASH, "a1b2c3d", started=at(2))
    assert found.label == NOT_CHECKED and "could not be checked" in found.why
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # git itself missing
    assert check(tmp_path, HASH, "a1b2c3d", started=at(2)).label == NOT_CHECKED


# ---- the index's labels: recomputed from git whenever it is written or printed ----------------


def index_row(commit, started=None, created=None, wall=0.0, status="pre-registered"):
    """An index row as ``eval.findings.common.row_provenance`` records its report."""
    return {
        "name": "toy",
        "claim": {"title": "Toy", "statement": "S.", "source": "X"},
        "measured": "1",
        "verdict": "reproduced",
        "rule": "r",
        "scale": "cpu",
        "wall_seconds": wall,
        "report": "",
        # a stored label, as an older index might hold it: never the one shown
        "registration": "pre-registered",
        "provenance": {
            "git_commit": commit,
            "git_dirty": False,
            "source_hash": "s",
            "created": created,
            "registration_status": status,
            "registration_hash": HASH,
            "runs_commit": commit,
            "runs_started": started,
        },
    }


def test_the_index_label_is_checked_from_git_not_copied(repo, tmp_path, capsys):
    root, run = repo
    commit_registry(root, run, [OTHER], at(1))
    commit_registry(root, run, [HASH, OTHER], at(3), "register after the fact")
    result = commit_result(root, run, at(4))
    row = index_row(result, started=at(2).isoformat())
    found = result_label(row, root)
    assert found.label == AFTER_THE_RESULT
    # a report older than recorded starts: its time less its wall time stands for the start
    estimated = index_row(result, created=at(2, 13).isoformat(), wall=3600.0)
    found = result_label(estimated, root)
    assert found.label == AFTER_THE_RESULT and "estimated" in found.why
    assert result_label(index_row(result, created=at(3, 13).isoformat()), root).label == (
        PRE_REGISTERED
    )
    # an exploratory report stays exploratory, whatever git says
    assert result_label(index_row(result, at(5).isoformat(), status="exploratory"), root).label == (
        "exploratory"
    )
    # the index written over this history stores the checked label and its evidence, and the
    # table shows it in place of the row's own
    rows = [dict(row)]
    out = tmp_path / "index"
    data = write_rows(out, rows, root)
    assert data["findings"][0]["registration"] == AFTER_THE_RESULT
    assert data["findings"][0]["registration_check"]["registration_commit"]
    assert f"| **reproduced** | {AFTER_THE_RESULT} |" in (out / "index.md").read_text()
    assert checked_labels({"findings": [row]}, root) == {"toy": AFTER_THE_RESULT}


def write_rows(out, rows, root):
    results = [
        FindingResult(**{k: v for k, v in r.items() if k != "claim"}, claim=Claim(**r["claim"]))
        for r in rows
    ]
    write_index(out, "cpu", results, {}, root=root)
    return json.loads((out / "index.json").read_text())
