"""The job commands (compare, sweep, findings, the exact frontier) end to end under the runtime
audit of file events of ``tests/test_file_audit.py``: every event in a user's folder (the job
folder, its runs and stages, the typed cache) is the door's. Apart from the other commands so
that the two modules run on two workers."""

import pytest
from test_file_audit import CLI, audited, described

pytestmark = pytest.mark.slow

JOBS = [
    (
        "compare",
        [*CLI, "compare", "--preset", "smoke", "--out", "job", "--no-mauve"]
        + ["--max-steps", "24", "--warmup-steps", "2", "--cache-dir", "cache"],
    ),
    (
        "sweep",
        [*CLI, "sweep", "--preset", "smoke", "--out", "sweep", "--block-sizes", "4"]
        + ["--max-steps", "4", "--cache-dir", "cache"],
    ),
    (
        "findings",
        [*CLI, "findings", "--scale", "smoke", "--out", "findings", "--only", "reversal"]
        + ["--cache-dir", "cache"],
    ),
    (
        "exact frontier",
        ["-m", "eval.experiments.exact_frontier", "--out", "frontier"] + ["--scale", "smoke"],
    ),
]


@pytest.fixture(scope="module")
def job_sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-jobs")
    for name in ("work", "home", "tmp", "reports"):
        (root / name).mkdir()
    return root


@pytest.mark.parametrize("name, argv", JOBS, ids=[job[0] for job in JOBS])
def test_every_file_event_of_a_job_is_the_doors(job_sandbox, name, argv):
    code, violations, output = audited(job_sandbox, argv)
    assert code == 0, f"{name} ended with {code}:\n{output[-3000:]}"
    assert not violations, f"{name}:\n{described(violations)}"
