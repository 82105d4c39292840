"""Whether a finding's registration provably came before its result, checked from git.

A matching hash shows that a result ran under the registered claim, settings, rule and code, not
that the registration existed before the result was known: the runs are deterministic given
their seeds, so a registration written after a result would match too. What git can show is the
order. A result counts as pre-registered only if the commit that first added its registration
hash to ``eval/findings/registered.json`` is an ancestor of the commit the result ran at, and
that commit's time (the committer's clock, as git records it) precedes the run's start.

    check(root, "0123abcd4567ef89", result_commit="a1b2c3d", started=start_time)
    -> Check(label="pre-registered", why="...", registration_commit="9f8e...", registered_at=...)

Labels: ``pre-registered``; ``registered after the result`` (the registration commit is no older
than the run); ``registration not committed`` (no commit of the registry holds the hash);
``registration not in the result's history`` (the registration commit is not an ancestor of the
result's commit, or the result names no commit); ``not checked (no git)`` (no git checkout, or
git is not installed), which says that it could not be checked rather than that it failed.
An index row whose report ran under no registered hash (``eval.findings.registration``) is
``exploratory`` before any of this (``result_label``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from eval.provenance import git_output

PRE_REGISTERED = "pre-registered"
AFTER_THE_RESULT = "registered after the result"
NOT_COMMITTED = "registration not committed"
NOT_IN_HISTORY = "registration not in the result's history"
NOT_CHECKED = "not checked (no git)"
REGISTRY_PATH = "eval/findings/registered.json"


@dataclass(frozen=True)
class Check:
    """The label, the sentence that says why, and the registration commit git found."""

    label: str
    why: str
    registration_commit: str | None = None
    registered_at: datetime | None = None


COMMIT = re.compile(r"[0-9a-f]{40}")


def registration_commit(
    root: Path, registration_hash: str, registry: str = REGISTRY_PATH, within: str = "--all"
) -> tuple[str, datetime] | None:
    """The oldest commit in the history of ``within`` (a commit, or every branch) that added
    ``registration_hash`` to ``registry``, with its commit time (git's pickaxe: commits that
    change how often the text occurs), or None."""
    out = git_output(
        "log", within, "--reverse", "--format=%H %ct", "-S", registration_hash, "--", registry,
        cwd=root, timeout=60,
    )  # fmt: skip
    lines = (out or "").split("\n")
    if not lines[0].strip():
        return None
    commit, seconds = lines[0].split()
    return commit, datetime.fromtimestamp(int(seconds), UTC)


def check(
    root: Path,
    registration_hash: str,
    result_commit: str | None,
    started: datetime,
    registry: str = REGISTRY_PATH,
) -> Check:
    """The label of a result with ``registration_hash`` that ran at ``result_commit`` from
    ``started`` (aware UTC), from the git history of ``root`` (the rules of the docstring).
    Only the result's own history is searched: a first registration on a draft branch that
    never reached it does not stand in for the one that did."""
    if git_output("rev-parse", "--git-dir", cwd=root) is None:
        return Check(NOT_CHECKED, f"no git history at {root}: whether the registration came "
                     "before the result could not be checked")  # fmt: skip
    valid = isinstance(result_commit, str) and COMMIT.fullmatch(result_commit) is not None
    found = registration_commit(root, registration_hash, registry, result_commit) if valid else None
    if found is None:
        elsewhere = registration_commit(root, registration_hash, registry)
        if elsewhere is None:
            return Check(
                NOT_COMMITTED, f"no commit of {registry} holds the hash {registration_hash}"
            )
        shown = str(result_commit)[:40] if result_commit else "none recorded"
        why = "" if valid else " (not a commit: 40 hex digits)"
        return Check(
            NOT_IN_HISTORY,
            f"the registration commit {elsewhere[0][:7]} is not in the history of the result's "
            f"commit {shown}{why}",
            *elsewhere,
        )
    commit, when = found
    if when >= started:
        return Check(
            AFTER_THE_RESULT,
            f"registered by {commit[:7]} at {when.isoformat()}, after the run started at "
            f"{started.isoformat()}",
            commit,
            when,
        )
    return Check(
        PRE_REGISTERED,
        f"registered by {commit[:7]} at {when.isoformat()}, before the run started at "
        f"{started.isoformat()}, in the history of {result_commit[:7]}",
        commit,
        when,
    )


EXPLORATORY = "exploratory"


def run_start(row: dict) -> tuple[datetime | None, str]:
    """When an index row's runs started (aware UTC) and how that is known: the job stamp's
    start, recorded since starts were; for an older report, its time less its wall time (an
    estimate: the moment the invocation that wrote it began); None when neither is there."""
    prov = row.get("provenance") or {}
    if prov.get("runs_started"):
        return datetime.fromisoformat(prov["runs_started"]), ""
    if prov.get("created"):
        created = datetime.fromisoformat(prov["created"])
        return created - timedelta(seconds=float(row.get("wall_seconds") or 0)), (
            " (the run's start estimated as its report's time less its wall time: the report "
            "predates recorded starts)"
        )
    return None, ""


def result_label(row: dict, root: Path) -> Check:
    """The registration label of an index row, from its report's provenance and the git history
    of ``root``: exploratory when the report's own hash check said so, else ``check`` on the
    hash it ran under (not today's: a later re-registration leaves it as it was), the commit
    that trained its runs and their start."""
    prov = row.get("provenance") or {}
    if (prov.get("registration_status") or row.get("registration")) == EXPLORATORY:
        return Check(EXPLORATORY, "its report ran under no registered hash (the report says why)")
    started, estimated = run_start(row)
    if not prov.get("registration_hash") or started is None:
        return Check(NOT_IN_HISTORY, "the row records no registration hash or run start")
    commit = prov.get("runs_commit") or prov.get("git_commit")
    found = check(root, prov["registration_hash"], commit, started)
    return Check(found.label, found.why + estimated, found.registration_commit, found.registered_at)
