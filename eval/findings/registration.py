"""Pre-registration of findings: each finding's claim, settings and verdict rule, hashed and
committed in ``registered.json`` before its verdict runs.

The hash covers the claim, the settings, the rule, the resolved training configuration of every
run (the preset expanded, not its name, and ``precision="auto"`` as it resolves on the machine:
bf16 with AMX or a bf16 GPU, fp32 elsewhere) and the source of the verdict code (``verdicts.py``,
``common.py``, the finding's own module and the helpers it judges with), so editing any of them
after the registration makes a run exploratory. The registry keeps what the configuration
resolved to when it was registered (``resolved``): a run whose configuration resolves otherwise
(another precision on another CPU) is labelled exploratory, naming the difference, and the
registry's own staleness is judged with the registered resolution, so it holds on any machine.
A report records the hash of what it ran with
and the code that ran it (commit, dirty flag, source hash). It is *pre-registered* when that hash
is the registered one and the code was a clean commit (no changed tracked file and no untracked
file git does not ignore); otherwise it is *exploratory* and says why (something hashed changed
after the registration, nothing registered, uncommitted code). A registration that is replaced
keeps the old hash and the reason in its history, so a reviewer sees when a rule moved after a
run.

    python -m eval.findings.register                        # which entries are stale
    python -m eval.findings.register --because "reason"     # register the current ones
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eval.experiments.job_folder import check_job_folder
from shared import door
from shared.door import read_json_file, write_atomic
from shared.hardware import bf16_is_fast
from shared.training import resolve_config
from shared.training.run_folder import FINDINGS_STAMP, contents, mark_folder, move_aside

REGISTRY = Path(__file__).with_name("registered.json")
PRE_REGISTERED, EXPLORATORY = "pre-registered", "exploratory"
JOB_STAMP = FINDINGS_STAMP
# What a job folder must share with this invocation to be reused (its commit may differ: a
# commit that changes no source, e.g. documentation, leaves the runs valid).
REUSE_KEYS = ("source_hash", "registration")


def _plain(value: Any) -> Any:
    return asdict(value) if is_dataclass(value) else value


# The code every verdict goes through (intervals, rules, the learned gate, the report's verdict
# section); a finding adds its own module and the helpers it judges with (``Finding.judged_by``).
JUDGING_CODE = ("eval.findings.verdicts", "eval.findings.common")


# Where a run keeps its cache and how many threads it uses (``Job.extra``), how often it logs
# and where to, and the file format of its checkpoints (single or sharded: either resumes to the
# same numbers): they leave its results unchanged and may differ between machines.
MACHINE_LOCAL = (
    "cache_dir",
    "num_threads",
    "log_with",
    "log_every",
    "peak_tflops",
    "checkpoint_format",
)
# Settings only one objective reads (its name beside them): under any other objective they
# change nothing, so a setting added with a family leaves the other families' registrations.
OBJECTIVE_ONLY = {"alpha_0": "eso"}


def module_text(name: str) -> str:
    """The source text of the module ``name`` (read from its file, as it is now)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(f"no source file for module {name!r}")
    return Path(spec.origin).read_text()


def verdict_code(finding: Any) -> dict[str, str]:
    """The hash of each module whose source decides ``finding``'s verdict."""
    own = getattr(getattr(finding, "run", None), "__module__", None)
    names = [*JUDGING_CODE, *([own] if own else []), *getattr(finding, "judged_by", ())]
    return {
        name: hashlib.sha256(module_text(name).encode()).hexdigest()[:16]
        for name in dict.fromkeys(names)
    }


def machine_resolution() -> dict[str, str]:
    """What the machine-dependent settings resolve to here: ``precision="auto"`` trains in bf16
    where ``shared.hardware.bf16_is_fast`` says so, in fp32 elsewhere."""
    return {"precision": "bf16" if bf16_is_fast() else "fp32"}


def training_configs(
    finding: Any, scale: str, resolution: dict[str, str] | None = None
) -> dict[str, Any]:
    """The resolved configuration (the preset expanded by ``shared.training.resolve_config``,
    data spec included, ``precision="auto"`` replaced by what it resolves to: ``resolution``,
    this machine's by default) of every run ``finding`` trains at ``scale``: a changed preset or
    default changes the registration, not only a changed preset name."""
    runs = getattr(finding, "runs", None)
    if runs is None:
        return {}
    resolution = resolution or machine_resolution()
    resolved = {}
    for name, (preset, overrides) in runs(finding.settings[scale]).items():
        model, train = resolve_config(preset, overrides)
        fields = set_fields(train)
        if fields.get("precision") == "auto":
            fields["precision"] = resolution["precision"]
        resolved[name] = {"model": set_fields(model), "train": fields}
    return resolved


def set_fields(config: Any) -> dict[str, Any]:
    """The fields of a resolved configuration that are set, machine-local ones left out: a field
    at an off value (0, "", False) reads as absent, so an option added later, off by default,
    leaves every registration as it was, while any value that changes (a default included)
    changes it."""
    objective = getattr(config, "objective", None)
    return {
        name: value
        for name, value in asdict(config).items()
        if name not in MACHINE_LOCAL
        and OBJECTIVE_ONLY.get(name, objective) == objective
        and value != ""
        and not (isinstance(value, int | float) and value == 0)
    }


def registration_hash(finding: Any, scale: str, resolution: dict[str, str] | None = None) -> str:
    """The hash of everything that decides a finding's verdict at ``scale``: its claim, its
    settings, its declared rule (band, thresholds, learned checks), the training configuration
    of every run it trains as it resolves (``resolution``, this machine's by default), and the
    source of the code that judges it."""
    payload = {
        "finding": finding.name,
        "claim": _plain(finding.claim),
        "scale": scale,
        "settings": _plain(finding.settings[scale]),
        "rule": finding.rule,
        "training": training_configs(finding, scale, resolution),
        "code": verdict_code(finding),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_registry(path: Path = REGISTRY) -> dict[str, Any]:
    return door.read_json_object(path) if path.exists() else {}


def registration(finding: Any, scale: str, code: dict[str, Any], registry=None) -> dict[str, Any]:
    """The registration status of a run of ``finding`` at ``scale`` with ``code``
    (``eval.provenance.code_state``) on this machine: status, hash, the registered entry and why."""
    entry = (load_registry() if registry is None else registry).get(finding.name, {}).get(scale)
    here = machine_resolution()
    current = registration_hash(finding, scale, here)
    if entry is None:
        why = "nothing is registered for this finding and scale"
    elif entry["hash"] != current:
        why = mismatch_reason(finding, scale, entry, current, here)
    elif code.get("git_dirty") is not False:
        why = "the code had uncommitted changes (or no git checkout), so no commit names it"
    else:
        why = ""
    revisions = len(entry.get("history", [])) if entry else 0
    return {
        "status": EXPLORATORY if why else PRE_REGISTERED,
        "hash": current,
        "resolved": here,
        "registered": entry,
        "revisions": revisions,
        "why": why,
    }


def mismatch_reason(
    finding: Any, scale: str, entry: dict[str, Any], current: str, here: dict[str, str]
) -> str:
    """Why a run's hash is not the registered one: its configuration resolved otherwise on this
    machine (naming each difference), or something hashed changed after the registration."""
    registered = entry.get("resolved")
    if registered and registered != here:
        if registration_hash(finding, scale, registered) == entry["hash"]:
            differences = ", ".join(
                f"{key} {here.get(key)} here, {value} when registered"
                for key, value in registered.items()
                if here.get(key) != value
            )
            return (
                f"its configuration resolves differently on this machine ({differences}), so "
                "it is not the registered run"
            )
    return (
        f"its settings, rule, training configuration or verdict code (hash {current}) differ "
        f"from those registered on {entry['registered']} (hash {entry['hash']})"
    )


def registration_text(status: dict[str, Any]) -> str:
    """The report's line about its registration."""
    if status["status"] == EXPLORATORY:
        return f"**Exploratory run**: {status['why']}. Its verdict is not a reproduction verdict."
    entry = status["registered"]
    revised = (
        f"; revised {status['revisions']} time(s) before, the last because: "
        f"{entry['history'][-1]['replaced_because']}"
        if status["revisions"]
        else ""
    )
    resolved = ", ".join(f"{k} {v}" for k, v in status.get("resolved", {}).items())
    return (
        f"**Pre-registered**: settings, rule, training (resolved: {resolved}) and verdict-code "
        f"hash `{status['hash']}`, registered on {entry['registered']} in "
        f"`eval/findings/registered.json`{revised}."
    )


def stale_entries(findings: dict[str, Any], registry: dict[str, Any]) -> list[tuple[str, str]]:
    """The (finding, scale) pairs whose hash, under the resolution they were registered with, is
    not the registered one (an entry without a recorded resolution is stale)."""
    stale = []
    for name, finding in findings.items():
        for scale in finding.settings:
            entry = registry.get(name, {}).get(scale, {})
            resolved = entry.get("resolved")
            if not resolved or entry.get("hash") != registration_hash(finding, scale, resolved):
                stale.append((name, scale))
    return stale


def register(findings: dict[str, Any], because: str, path: Path = REGISTRY) -> list[str]:
    """Register the current hash of every stale entry of ``findings``, keeping the replaced one
    in history."""
    registry = load_registry(path)
    today = datetime.now(UTC).date().isoformat()
    changed = []
    for name, scale in stale_entries(findings, registry):
        old = registry.setdefault(name, {}).get(scale)
        history = [] if old is None else old.get("history", [])
        if old is not None:
            history = history + [
                {"hash": old["hash"], "registered": old["registered"], "replaced_because": because}
            ]
        resolution = machine_resolution()
        registry[name][scale] = {
            "hash": registration_hash(findings[name], scale, resolution),
            "resolved": resolution,
            "registered": today,
            "history": history,
        }
        changed.append(f"{name}/{scale}")
    write_atomic(path, json.dumps(registry, indent=2, sort_keys=True) + "\n")
    return changed


def fresh_job_folder(
    out: Path, stamp: dict[str, Any], force: bool, root: Path | None = None
) -> None:
    """Make ``out`` hold only work done by this code and these settings: when it holds a job
    stamped with another source hash or registration hash (or ``force``), move that job aside
    (nothing is deleted), so no trained run or stored stage is reused across a change. A reused
    job keeps its stamp, so its reports name the commit that trained its runs. A folder that is
    not a finding's (no marker, or another kind's) is refused before anything moves; ``root``:
    the findings folder that holds ``out`` (its files are read and written inside it)."""
    root = Path(root if root is not None else out)
    check_job_folder(out, force, "findings job")
    path = out / JOB_STAMP
    if contents(out):
        earlier = read_json_file(path, root=root) if os.path.lexists(path) else None
        same = earlier is not None and all(earlier.get(k) == stamp.get(k) for k in REUSE_KEYS)
        if same and not force:
            return  # reused: its stamp keeps the commit that trained its runs
        why = "--force" if force else f"it was made by other code or settings ({earlier})"
        print(f"[{out.name}] moved the earlier job aside to {move_aside(out)}: {why}")
    door.make_folders(out, root)
    write_atomic(path, json.dumps(stamp, indent=2, sort_keys=True), root=root)
    mark_folder(out, "findings job")
