"""Launch target that runs train.py under accelerate's FSDP on CPU processes (tests only).

accelerate turns on FSDP only for accelerator devices; on CPU ranks it falls back to plain data
parallelism over gloo. FSDP2 itself runs on CPU, so this script switches accelerate's state to
FSDP with the plugin the launch configuration describes, then runs train.py unchanged:

    ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/fsdp_1node.yaml \\
        --num_processes 2 --mixed_precision no tests/fsdp_on_cpu.py --preset tiny ...
"""

import sys
from pathlib import Path

import accelerate.state
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.training import cli  # noqa: E402  (after the project root is on the path)

_original_init = accelerate.state.AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = FullyShardedDataParallelPlugin()  # reads the launcher's FSDP_* env
        if self._mixed_precision != "no":  # as accelerate does when it enables FSDP itself
            self.fsdp_plugin.set_mixed_precision(self._mixed_precision)


accelerate.state.AcceleratorState.__init__ = _init_with_fsdp_on_cpu

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
