"""configs/slurm/train.sbatch under stub ``srun`` and ``scontrol``: the job script exits with
srun's own status in every order of events (srun ending before the wait, before the time-limit
signal, after it), passes the signal on once, and requeues exactly on 75."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "configs" / "slurm" / "train.sbatch"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# The stub srun: records its arguments, then acts as STUB_MODE says. Each mode is one order of
# events; "ready" is written once the stub runs, "got-usr1" on each USR1 it receives.
SRUN = """#!/bin/bash
echo "$@" > "$STUB_DIR/args"
trap 'echo usr1 >> "$STUB_DIR/got-usr1"; [ "$STUB_MODE" = ignore-then-75 ] || exit 75' USR1
touch "$STUB_DIR/ready"
case "$STUB_MODE" in
    exit-*) exit "${STUB_MODE#exit-}" ;;
    75-then-signal) kill -USR1 "$PPID"; exit 75 ;;
    ignore-then-75)
        while [ ! -e "$STUB_DIR/got-usr1" ]; do sleep 0.02; done
        sleep 0.3; exit 75 ;;
esac
while :; do sleep 0.02; done
"""

SCONTROL = """#!/bin/bash
case "$1" in
    show) echo node-a; echo node-b ;;
    requeue) echo "$2" >> "$STUB_DIR/requeued" ;;
esac
"""


def stubs(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def start_job(tmp_path: Path, mode: str) -> subprocess.Popen:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{stubs(tmp_path)}:{os.environ['PATH']}",
        "HOME": str(home),
        "STUB_DIR": str(tmp_path),
        "STUB_MODE": mode,
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "OUT": str(tmp_path / "run"),
    }
    job = subprocess.Popen(
        ["bash", str(SCRIPT), "--preset", "tiny"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return job


def wait_for(path: Path, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def finish(job: subprocess.Popen) -> tuple[int, str]:
    output, _ = job.communicate(timeout=30)
    return job.returncode, output


def requeued(tmp_path: Path) -> list[str]:
    file = tmp_path / "requeued"
    return file.read_text().split() if file.exists() else []


@pytest.mark.parametrize("status", [0, 2, 3, 75])
def test_srun_ending_on_its_own_gives_its_status(status, tmp_path):
    """srun exits at once, before the script reaches its wait (the order the old loop lost:
    it saw no srun running and exited 0)."""
    code, output = finish(start_job(tmp_path, f"exit-{status}"))
    assert code == status, output
    assert requeued(tmp_path) == (["4242"] if status == 75 else [])
    assert "--out" in (tmp_path / "args").read_text()
    assert "--resume auto" in (tmp_path / "args").read_text()


def test_the_time_limit_signal_reaches_srun_once_and_requeues(tmp_path):
    """USR1 while srun runs: passed on once, srun saves and exits 75, the job requeues."""
    job = start_job(tmp_path, "wait")
    wait_for(tmp_path / "ready")
    job.send_signal(signal.SIGUSR1)
    code, output = finish(job)
    assert code == 75, output
    assert (tmp_path / "got-usr1").read_text().split() == ["usr1"]
    assert requeued(tmp_path) == ["4242"]
    assert "requeueing job 4242 and exiting with 75" in output


def test_srun_ending_after_the_trap_returned_keeps_its_status(tmp_path):
    """The trap runs while srun still saves (a blocking `wait` cut short by it returned 138,
    and a second `wait` lost the status): the script exits with srun's 75."""
    job = start_job(tmp_path, "ignore-then-75")
    wait_for(tmp_path / "ready")
    job.send_signal(signal.SIGUSR1)
    code, output = finish(job)
    assert code == 75, output
    assert requeued(tmp_path) == ["4242"]


def test_a_signal_that_comes_as_srun_ends_keeps_srun_s_status(tmp_path):
    """srun sends the job USR1 and exits 75 at once, so srun ends before, during or after the
    trap (repeated, to meet more than one order): the status is srun's 75, one requeue."""
    for attempt in range(5):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        code, output = finish(start_job(folder, "75-then-signal"))
        assert code == 75, output
        assert requeued(folder) == ["4242"]
