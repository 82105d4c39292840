"""One training entry for every objective, run plainly or under ``accelerate launch``.

    python train.py --objective ar  --preset demo --out runs/demo-ar
    python train.py --objective mdm --preset demo --out runs/demo-mdm
    python train.py --objective bd --block-size 4 --preset demo --out runs/demo-bd
    python train.py --objective udm --preset demo --out runs/demo-udm   # uniform-state diffusion
    accelerate launch train.py --objective mdm --preset small --out runs/small-mdm
    python train.py --resume runs/demo-mdm --max-steps 1200    # continue a run

Every ModelConfig and TrainConfig field is a flag (``python train.py --help``). The training
itself is the library ``shared.training``; from Python, call it with a typed spec:
``shared.training.train(shared.training.new_run("demo", "runs/x", objective="mdm"))``.
"""

import signal
import sys


def stop_outside_training(signum: int, frame) -> None:
    """SIGTERM or SIGINT while no run holds the signals: during start-up (the imports take
    seconds, and the checks before the run claims its folder) or after the run has handed them
    back. No training step is in progress, so exit at once, and say so rather than die silently
    (the run installs its own handler, which finishes the step and saves, while it trains)."""
    name = signal.Signals(signum).name
    print(
        f"stopped by {name} outside the training steps (start-up or shutdown): no step was "
        "interrupted and no checkpoint was being written",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    for stop_signal in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(stop_signal, stop_outside_training)
    from shared.training.cli import main

    sys.exit(main())
