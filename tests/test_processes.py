"""The processes of one launch agree (shared/training/processes.py): a decision is taken on the
main process alone and every process gets it, a refusal there is every process's, and a process
that waits longer than DUOLM_WAIT_TIMEOUT stops with one line naming what it waited for."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch import free_port

from shared.errors import ConfigError
from shared.training import processes

ROOT = Path(__file__).resolve().parent.parent

# Each process calls decided_on_main; only the main process may run ``decide`` (another one
# that runs it fails loudly). The mode says what the main process does.
WORKER = """
import os, sys, time
from shared.training.processes import decided_on_main
from shared.errors import ConfigError
from shared.errors import result_or_status
from shared.training.loop import release_process_group

mode = sys.argv[1]

def decide():
    if os.environ["RANK"] != "0":
        raise SystemExit("decide ran on a process other than the main one")
    if mode == "refuse":
        raise ConfigError("the main process says no")
    if mode == "slow":
        time.sleep(8)
    return {"checkpoint": "step_000006"}

try:
    value, status = result_or_status(lambda: decided_on_main("pick a checkpoint", decide))
    print("value", value, flush=True)
finally:
    release_process_group()  # as train.py's main does
sys.exit(status)
"""


def launch_two(mode: str, timeout_s: str = "60") -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = os.environ | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "ACCELERATE_USE_CPU": "1",
            "DUOLM_WAIT_TIMEOUT": timeout_s,
            "PYTHONPATH": str(ROOT),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, mode],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


@pytest.mark.parametrize(
    "text",
    ["0", "-5", "nan", "inf", "soon", "1e9"],
    ids=["zero", "negative", "nan", "inf", "word", "huge"],
)
def test_a_bad_wait_timeout_is_one_line(text, monkeypatch):
    monkeypatch.setenv(processes.WAIT_TIMEOUT_VARIABLE, text)
    with pytest.raises(ConfigError, match=r"DUOLM_WAIT_TIMEOUT=.* must be a number of seconds"):
        processes.wait_timeout()


def test_the_wait_timeout_defaults_and_is_settable(monkeypatch):
    monkeypatch.delenv(processes.WAIT_TIMEOUT_VARIABLE, raising=False)
    assert processes.wait_timeout().total_seconds() == processes.DEFAULT_WAIT_TIMEOUT_S
    monkeypatch.setenv(processes.WAIT_TIMEOUT_VARIABLE, "2.5")
    assert processes.wait_timeout().total_seconds() == 2.5


def test_one_process_decides_without_a_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert processes.decided_on_main("pick", lambda: 7) == 7


@pytest.mark.multiprocess
def test_the_main_process_decides_and_every_process_gets_its_answer():
    main, other = launch_two("decide")
    for proc in (main, other):
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "value {'checkpoint': 'step_000006'}" in proc.stdout


@pytest.mark.multiprocess
def test_a_refusal_on_the_main_process_stops_every_process():
    main, other = launch_two("refuse")
    assert main.returncode == other.returncode == 2, main.stderr[-2000:] + other.stderr[-2000:]
    # the main process reports it, once; the other stops without a second copy of the line
    assert main.stderr.count("error: the main process says no") == 1, main.stderr
    assert "error:" not in other.stderr


@pytest.mark.multiprocess
def test_a_process_that_waits_past_the_timeout_stops_with_one_line():
    main, other = launch_two("slow", timeout_s="3")
    assert other.returncode != 0
    lines = [line for line in other.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, other.stderr[-2000:]
    assert "waited 3 s for the main process to pick a checkpoint" in lines[0]
    assert "DUOLM_WAIT_TIMEOUT" in lines[0]
