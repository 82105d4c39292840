"""The Slurm launcher helper: the command of each node from Slurm's environment, the refusal of
an environment that lacks a variable (naming it), and the status that requeues a job."""

import subprocess
import sys

import pytest

from shared.errors import ConfigError
from shared.training import slurm
from shared.training.cli import REQUEUE_STATUS

JOB = {
    "SLURM_JOB_ID": "77",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "MASTER_ADDR": "node01",
    "SLURM_GPUS_ON_NODE": "4",
}


def test_each_node_launches_its_share_of_the_processes():
    command = slurm.launch_command(JOB, "fsdp.yaml", None, ["train.py", "--resume", "auto"])
    flags = dict(zip(command[2:-3:2], command[3:-3:2], strict=True))
    assert flags["--num_machines"] == "2" and flags["--machine_rank"] == "1"
    assert flags["--num_processes"] == "8" and flags["--main_process_ip"] == "node01"
    assert flags["--main_process_port"] == "29500"
    assert command[-3:] == ["train.py", "--resume", "auto"]


def test_a_slurm_environment_without_its_variables_is_refused_naming_them(monkeypatch, capsys):
    for name in ("SLURM_NODEID", "MASTER_ADDR", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("SLURM_JOB_ID", "SLURM_NNODES"):
        monkeypatch.setenv(name, JOB[name])
    assert slurm.main(["--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "lacks SLURM_NODEID, MASTER_ADDR, SLURM_GPUS_ON_NODE" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("node", ["2", "7", "-1", "one"])
def test_a_node_number_outside_the_job_is_refused(node):
    """SLURM_NODEID must name one of the job's SLURM_NNODES nodes (0..N-1): node 2 of a
    two-node job would give accelerate a machine rank no rendezvous ever completes."""
    with pytest.raises(ConfigError, match=r"SLURM_NODEID=.* must be this node's number in 0\.\.1"):
        slurm.launch_command(JOB | {"SLURM_NODEID": node}, "f.yaml", None, ["train.py"])


def test_a_stopped_run_asks_to_be_requeued_and_nothing_else_does():
    assert slurm.exit_status(0, signalled=True) == 0  # it finished before the signal
    assert slurm.exit_status(1, signalled=True) == REQUEUE_STATUS  # torchrun's failure
    assert slurm.exit_status(2, signalled=False) == 2  # a user error ends the job
    assert slurm.exit_status(-9, signalled=False) == 137


def test_the_first_signal_is_passed_on_once(tmp_path):
    """The helper hands SIGUSR1 to its launcher once, and reports the requeue status."""
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        "print('ready', flush=True)\n"
        "time.sleep(3)\n"
        "print('signals', len(got), flush=True)\n"
        "sys.exit(1)\n"
    )
    code = (
        "import os, signal, sys, threading\n"
        "from shared.training import slurm\n"
        "def poke():\n"
        "    import time; time.sleep(1.5)\n"
        "    os.kill(os.getpid(), signal.SIGUSR1); os.kill(os.getpid(), signal.SIGUSR1)\n"
        "threading.Thread(target=poke).start()\n"
        f"sys.exit(slurm.run([sys.executable, {str(child)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == REQUEUE_STATUS, done.stderr
    assert "signals 1" in done.stdout
