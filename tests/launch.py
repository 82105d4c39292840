"""The command line that starts train.py as two CPU processes over gloo under accelerate."""

import socket


def free_port() -> int:
    """A TCP port that nothing listens on now (a fixed port collides when two test runs share
    the machine)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_cpu_processes(port: int) -> list[str]:
    """``accelerate launch`` arguments up to the script (run with ``ACCELERATE_USE_CPU=1``)."""
    return [
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
    ]
