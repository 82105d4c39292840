"""One training entry for every objective, run plainly or under ``accelerate launch``.

    python train.py --objective ar  --preset demo --out runs/demo-ar
    python train.py --objective mdm --preset demo --out runs/demo-mdm
    python train.py --objective bd --block-size 4 --preset demo --out runs/demo-bd
    accelerate launch train.py --objective mdm --preset small --out runs/small-mdm
    python train.py --resume runs/demo-mdm --max-steps 1200    # continue a run

Every ModelConfig and TrainConfig field is a flag (``python train.py --help``). The training
itself is the library ``shared.training``; from Python, call it with a typed spec:
``shared.training.train(shared.training.new_run("demo", "runs/x", objective="mdm"))``.
"""

import sys

from shared.training.cli import main

if __name__ == "__main__":
    sys.exit(main())
