"""Facts about the machine a run uses: peak FLOP/s for MFU, whether bf16 is fast, peak memory,
the CPU's name. Reports and benchmarks record them beside their numbers."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from shared import door
from shared.door import write_atomic
from shared.errors import ConfigError

# Dense bf16 peak of common accelerators (FLOP/s), for MFU.
GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L4": 121e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}


def peak_flops(
    device: torch.device,
    dtype: torch.dtype,
    override_tflops: float,
    cache_dir: Path | None = None,
) -> tuple[float, str]:
    """Hardware peak FLOP/s and where the number came from: ``--peak-tflops``, else the
    ``DUOLM_PEAK_TFLOPS`` environment variable (a machine's peak set once for every run on it),
    else the table of common GPUs, else a matmul measurement that is kept per device
    (``measured_peak``; it costs about 0.7 s at every start)."""
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    from_environment = environment_peak()
    if from_environment:
        return from_environment * 1e12, f"{PEAK_VARIABLE}={os.environ[PEAK_VARIABLE]}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_BF16.items():
            if key in name:
                return (value if dtype == torch.bfloat16 else value / 4), f"table ({name})"
    return measured_peak(device, dtype, cache_dir)


PEAK_CACHE = "peak-flops.json"
PEAK_VARIABLE = "DUOLM_PEAK_TFLOPS"


def environment_peak() -> float:
    """``DUOLM_PEAK_TFLOPS`` as a number (0 when unset); a value that is not a positive number
    is refused, naming it, rather than dividing MFUs by it."""
    text = os.environ.get(PEAK_VARIABLE, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{PEAK_VARIABLE}={text!r} must be a positive number of TFLOP/s")
    return value


def measured_peak(
    device: torch.device, dtype: torch.dtype, cache_dir: Path | None
) -> tuple[float, str]:
    """The highest matmul rate ever measured on this device, dtype and thread count (kept in
    ``cache_dir``/peak-flops.json), raised by this start-up's measurement when it is higher.

    Other work on the machine only ever lowers a measurement (a single 0.3 s window read 0.076
    TFLOP/s on a busy 2-core EPYC, against 0.16 idle, and the MFU it gave read 222%); the best
    one seen is the machine's attainable peak, so an MFU does not depend on what else ran at the
    second a run started once any run has measured the device idle."""
    key = f"{device_name(device)} | {dtype} | {torch.get_num_threads()} threads"
    measured = matmul_rate(device, dtype)
    path = Path(cache_dir) / PEAK_CACHE if cache_dir is not None else None
    known = read_peaks(path)
    best = max(measured, known.get(key, 0.0))
    if path is not None and best > known.get(key, 0.0):
        with contextlib.suppress(OSError):  # a read-only cache costs only the memory of it
            door.make_folders(path.parent)
            write_atomic(path, json.dumps(known | {key: best}, indent=2))
    if best > measured:
        return best, f"best matmul rate measured on this {key} (now {measured / 1e12:.3g})"
    return best, "measured matmul (best of 4 windows)"


def read_peaks(path: Path | None) -> dict[str, float]:
    if path is None or not path.is_file():
        return {}
    try:
        peaks = door.read_json_object(path, limit=1 << 16)
    except (OSError, ValueError):
        return {}  # a damaged cache is measured again
    return {k: float(v) for k, v in peaks.items() if isinstance(v, int | float)}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """A large matmul's FLOP/s in the training dtype (an attainable peak): the best of several
    short windows after a warm-up (a single cold window read from 0.076 to 0.16 TFLOP/s across
    the runs of one job on an idle 2-core EPYC)."""
    size = 1024
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def rate(seconds: float) -> float:
        repeats, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ b
            repeats += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return 2 * size**3 * repeats / (time.perf_counter() - start)

    rate(0.2)  # warm-up
    return max(rate(0.1) for _ in range(4))


def bf16_is_fast() -> bool:
    """Whether ``--precision auto`` trains in bf16 autocast: on CUDA GPUs with bf16 support, and
    on CPUs with AMX tiles, where the bf16 step measured 1.9x the fp32 one (Intel Xeon,
    docs/results.md). CPUs with AVX512-BF16 but no AMX (AMD Zen 4, Intel Cooper Lake) and CPUs
    without bf16 instructions keep fp32: bf16 there was not measured faster (emulated bf16 is
    slower, docs/results.md), and fp32 is the precision whose losses are exact."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def total_memory(device: torch.device) -> tuple[int, str]:
    """(bytes of memory a process on ``device`` can use at most, what holds them)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, "this GPU"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine"
    except (ValueError, OSError, AttributeError):
        return 2**62, "this machine"  # unknown: never refuse on it


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of this process: allocated by torch on a GPU, resident set size on a CPU."""
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_source": "torch.cuda.max_memory_allocated",
        }
    # ru_maxrss is in kilobytes on Linux (bytes on macOS)
    scale = 1 if sys.platform == "darwin" else 1024
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
        "peak_memory_source": "process max RSS",
    }


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo where there is one (platform.processor() is often
    empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
