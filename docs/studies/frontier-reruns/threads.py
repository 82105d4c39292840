"""Why batch-32 ratios do not reproduce: the demo's AR at T=1 and two MDM ancestral samplers at
batch 32, timed by eval.speed.throughput in fresh processes with 2 and with 1 torch threads, the two
alternating (2, 1, 1, 2, ...), 1 warm-up and 4 rounds each, with the KVM steal time
(/proc/stat) over each process. Needs the demo job's models in runs/demo-r (run.sh's OUT).

    python docs/studies/frontier-reruns/threads.py PAIRS > threads.log
"""

import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

NAMES = ["ar T=1", "mdm ancestral 8 steps", "mdm ancestral 64 steps"]


def steal():
    f = open("/proc/stat").readline().split()
    return int(f[8])


def one(threads, rounds):
    torch.set_num_threads(threads)
    from eval.experiments.compare_settings import settings_for
    from eval.experiments.compare_speed import timed_settings
    from eval.speed.throughput import host_probes, measure_batches

    out = Path("runs/demo-r/seed-0")
    builders = timed_settings(out, settings_for("demo", 128))
    s0 = steal()
    r = measure_batches(
        lambda n, b: builders[n](b), NAMES, [32], rounds=rounds, warmup=1, probes=host_probes()
    )
    return {"threads": threads, "steal": steal() - s0, "result": r.as_dict()}


if __name__ == "__main__":
    spawn = multiprocessing.get_context("spawn")
    runs = []
    for i in range(int(sys.argv[1])):
        for threads in (2, 1) if i % 2 == 0 else (1, 2):
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                runs.append(pool.submit(one, threads, 4).result())
            print(time.strftime("%H:%M:%S"), threads, "steal", runs[-1]["steal"], flush=True)
    json.dump(runs, open(Path(__file__).parent / "threads.json", "w"))
