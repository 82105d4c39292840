"""Proof by audit: every command runs end to end on a sandbox under a runtime audit of its file
events (``tests/file_audit/audit_hook.py``, installed in every process the command starts), and
the test fails on any open, folder made, rename, removal, mode change or link in a user's
folder that ``shared.door`` did not perform, and on any event outside the sandbox but reads of
the installed packages, the project's source and the running system.

The break checks add one raw ``open`` and one raw ``mkdir`` under a user's folder to a real
command (through ``DUOLM_AUDIT_INJECT``, read by ``inject.py`` beside the hook) and see the
audit catch each, so the audit is not vacuous."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOK_FOLDER = Path(__file__).resolve().parent / "file_audit"

pytestmark = pytest.mark.slow


def audited(sandbox: Path, argv: list[str], inject: str = "") -> tuple[int, list[dict], str]:
    """Run ``argv`` (a Python command line) in ``sandbox/work`` under the audit: its status,
    the violations of every process it started, and its output."""
    reports = sandbox / "reports" / str(len(list((sandbox / "reports").glob("*"))))
    reports.mkdir(parents=True)
    env = {
        # the test process's own settings of duolm and torch's compiler caches stay behind
        **{k: v for k, v in os.environ.items() if not k.startswith(("DUOLM_", "TORCHINDUCTOR_"))},
        "HOME": str(sandbox / "home"),
        "TMPDIR": str(sandbox / "tmp"),
        "PYTHONPATH": os.pathsep.join([str(HOOK_FOLDER), str(ROOT)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "DUOLM_AUDIT_DIR": str(reports),
        "DUOLM_AUDIT_SANDBOX": str(sandbox),
        "DUOLM_AUDIT_PROJECT": str(ROOT),
        "DUOLM_AUDIT_INJECT": inject,
    }
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=sandbox / "work",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    violations = [
        json.loads(line) for report in sorted(reports.glob("*.jsonl")) for line in report.open()
    ]
    return done.returncode, violations, done.stdout + done.stderr


def described(violations: list[dict]) -> str:
    return "\n".join(
        f"{v['event']} {v['path']} ({v['why']})\n    " + "\n    ".join(v["stack"])
        for v in violations[:10]
    )


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audit")
    for name in ("work", "home", "tmp", "reports"):
        (root / name).mkdir()
    corpus = "\n\n".join(
        f"Story {i}: the cat sat on the mat and looked at the sun." for i in range(200)
    )
    (root / "work" / "corpus.txt").write_text(corpus)
    # an lm-eval task is the user's input to lm-eval itself, which reads it by its own code: it
    # lies in the sandbox but outside the user's folders that duolm is held to
    tasks = root / "tasks"
    tasks.mkdir()
    rows = [{"question": "In the beginning God created the ", "choices": ["heaven", "qq"]}]
    (tasks / "choice.jsonl").write_text("".join(json.dumps(r | {"answer": 0}) + "\n" for r in rows))
    (tasks / "audit_choice.yaml").write_text(TASK.format(data=tasks / "choice.jsonl"))
    return root


TASK = """task: audit_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""


CLI = ["-m", "eval.cli"]
TRAIN = [str(ROOT / "train.py"), "--preset", "tiny", "--cache-dir", "cache", "--eval-every", "2"]
# Each command as a user types it, in the order a user would run them (later ones read what the
# earlier ones wrote), with the status it ends with.
COMMANDS = [
    ("train ar", [*TRAIN, "--objective", "ar", "--out", "ar", "--max-steps", "2"], 0),
    ("train mdm", [*TRAIN, "--objective", "mdm", "--out", "mdm", "--max-steps", "2"], 0),
    ("train udm", [*TRAIN, "--objective", "udm", "--out", "udm", "--max-steps", "2"], 0),
    ("resume", [str(ROOT / "train.py"), "--resume", "ar", "--max-steps", "3"], 0),
    (
        "train sharded",
        [*TRAIN, "--out", "sharded", "--max-steps", "2", "--checkpoint-format", "sharded"],
        0,
    ),
    ("resume sharded", [str(ROOT / "train.py"), "--resume", "sharded", "--max-steps", "3"], 0),
    ("convert to single", [*CLI, "convert-checkpoint", "sharded", "--to", "single"], 0),
    ("sample ar", [*CLI, "sample", "ar", "--prompt", "The", "--max-new-tokens", "4"], 0),
    ("sample mdm", [*CLI, "sample", "mdm", "--gen-length", "8", "--num-samples", "1"], 0),
    (
        "likelihood",
        [*CLI, "likelihood", "mdm", "--samples", "2", "--max-rows", "4", "--cache-dir", "cache"],
        0,
    ),
    ("export", [*CLI, "export", "ar", "exported"], 0),
    ("import", [*CLI, "import", "exported", "imported"], 0),
    ("convert", [*CLI, "convert-checkpoint", "ar", "--trust"], 0),
    (
        "shard-data",
        [*CLI, "shard-data", "--data", "corpus.txt", "--out", "shards", "--tokenizer", "byte"],
        0,
    ),
    (
        "distill",
        [*CLI, "distill", "udm", "student", "--rounds", "1", "--steps-per-round", "1"]
        + ["--base-steps", "4", "--cache-dir", "cache"],
        0,
    ),
    (
        "lm-eval",
        [*CLI, "lm-eval", "--model", "duolm", "--model_args", "checkpoint=ar"]
        + ["--tasks", "audit_choice", "--include_path", "../tasks", "--device", "cpu"],
        0,
    ),
    ("refused resume", [str(ROOT / "train.py"), "--resume", "ar", "--max-steps", "1"], 2),
]


@pytest.mark.parametrize("name, argv, status", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_file_event_of_a_command_is_the_doors(sandbox, name, argv, status):
    code, violations, output = audited(sandbox, argv)
    assert code == status, f"{name} ended with {code}:\n{output[-3000:]}"
    assert not violations, f"{name}:\n{described(violations)}"


@pytest.mark.parametrize("inject", ["open", "mkdir"])
def test_the_audit_catches_one_raw_event_under_a_users_folder(tmp_path, inject):
    for name in ("work", "home", "tmp", "reports"):
        (tmp_path / name).mkdir()
    argv = [*TRAIN, "--objective", "ar", "--out", "run", "--max-steps", "1"]
    code, violations, output = audited(tmp_path, argv, inject=inject)
    assert code == 0, output[-3000:]
    assert len(violations) == 1, described(violations)
    assert violations[0]["why"] == "not performed by the door"
    assert Path(violations[0]["path"]).is_relative_to(tmp_path / "work" / "run")
