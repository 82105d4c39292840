"""``python -m shared.training.slurm``: start ``accelerate launch`` on one node of a Slurm job,
with the node's place in the job read from Slurm's environment, and turn a preemption into the
status that requeues the job.

    srun python -m shared.training.slurm --config configs/accelerate/fsdp_2nodes.yaml \\
        -- train.py --preset owt-small --out runs/owt --resume auto

One task per node (``srun --ntasks-per-node=1``). From the environment: ``SLURM_JOB_ID``,
``SLURM_NNODES``, ``SLURM_NODEID`` (set by srun) and ``MASTER_ADDR`` (the first node's host
name, set by the job script; ``MASTER_PORT`` defaults to 29500); processes per node from
``--processes-per-node`` or ``SLURM_GPUS_ON_NODE``. A missing variable is refused naming it
(exit 2), before anything starts.

Signals: SIGUSR1 or SIGTERM sent to this helper (srun passes the job script's on) is passed once
to the launcher, which torchrun passes to its workers (``TORCHELASTIC_SIGNALS_TO_HANDLE``
names SIGUSR1 for it); a repeat is not passed on, since a second signal makes a run exit
without saving. The workers save at the end of their step and stop. When a signal came and
the launcher did not end cleanly (torchrun reports stopped workers as a failure), the helper
exits ``REQUEUE_STATUS`` (75), on which the job script requeues itself; ``--resume auto`` then
picks the newest valid checkpoint. torchrun gives its workers 30 s after the signal before it
kills them: a checkpoint that takes longer is lost and the previous one is resumed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping

from shared.cli_args import CommandParser
from shared.errors import ConfigError, report_user_errors
from shared.training.cli import REQUEUE_STATUS

REQUIRED = ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "MASTER_ADDR")
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def whole_number(env: Mapping[str, str], name: str) -> int:
    value = env[name].split("(")[0]  # SLURM_GPUS_ON_NODE may read "8(x2)" on some versions
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{name}={env[name]!r}; it must be a whole number >= 1")
    return int(value)


def launch_command(
    env: Mapping[str, str], config: str, per_node: int | None, script: list[str]
) -> list[str]:
    """The ``accelerate launch`` command line of this node; refuses a Slurm environment that
    lacks a variable it needs, naming every one missing."""
    needed = REQUIRED + (() if per_node else ("SLURM_GPUS_ON_NODE",))
    missing = [name for name in needed if not env.get(name)]
    if missing:
        raise ConfigError(
            f"the Slurm environment lacks {', '.join(missing)} (SLURM_* are set by srun inside "
            "a job; MASTER_ADDR by the job script, the first node's host name; "
            "SLURM_GPUS_ON_NODE by --gpus-per-node, or pass --processes-per-node)"
        )
    if not script:
        raise ConfigError("no script to launch: put it after --, e.g. -- train.py --resume auto")
    nodes = whole_number(env, "SLURM_NNODES")
    node = env["SLURM_NODEID"].strip()
    if not (node.isdigit() and int(node) < nodes):
        raise ConfigError(
            f"SLURM_NODEID={env['SLURM_NODEID']!r} must be this node's number in 0..{nodes - 1} "
            f"(SLURM_NNODES={nodes})"
        )
    per_node = per_node or whole_number(env, "SLURM_GPUS_ON_NODE")
    return [
        "accelerate",
        "launch",
        "--config_file",
        config,
        "--num_machines",
        str(nodes),
        "--machine_rank",
        str(int(node)),
        "--num_processes",
        str(nodes * per_node),
        "--main_process_ip",
        env["MASTER_ADDR"],
        "--main_process_port",
        env.get("MASTER_PORT", "29500"),
        *script,
    ]


def exit_status(returncode: int, signalled: bool) -> int:
    """The helper's status: the launcher's, except that a run stopped by a signal asks to be
    requeued."""
    if returncode == 0:
        return 0
    if signalled:
        return REQUEUE_STATUS
    return 128 - returncode if returncode < 0 else returncode


def run(command: list[str]) -> int:
    """Run the launcher, passing the first stop signal on to it once."""
    child = subprocess.Popen(
        command, env={**os.environ, "TORCHELASTIC_SIGNALS_TO_HANDLE": (TORCHRUN_SIGNALS)}
    )
    received: list[int] = []

    def forward(signum, frame):
        if not received:
            child.send_signal(signum)
        received.append(signum)

    for stop in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(stop, forward)
    return exit_status(child.wait(), bool(received))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, script = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :])
        if "--" in argv
        else (
            argv,
            [],
        )
    )
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/accelerate/fsdp_2nodes.yaml")
    parser.add_argument("--processes-per-node", type=int, default=0)
    parser.add_argument("--print", action="store_true", help="print the command, start nothing")
    args = parser.parse_args(ours)
    command, status = None, 0

    def build() -> None:
        nonlocal command
        command = launch_command(os.environ, args.config, args.processes_per_node, script)

    status = report_user_errors(build)
    if status or args.print:
        if command and args.print:
            print(" ".join(command))
        return status
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
