"""Speed of the lm-eval model "duolm" against lm-eval's own ``hf`` backend on the same weights
(an AR run and its ``duolm export``), the same requests and the same batch, in one process.

    python bench/lm_eval_speed.py                                 # demo-d256 shape, batch 8
    python bench/lm_eval_speed.py --run runs/demo-d256/ar --batch-size 16 --rounds 7
    python bench/lm_eval_speed.py --preset tiny --items 20 --rounds 3   # a quick check

Without ``--run`` an AR run of ``--preset`` is trained for one step in a temporary folder: the
shape sets the speed, not what the weights learned. The requests are lm-eval's two likelihood
kinds on distinct held-out verses of the run's corpus (no request repeats, so neither backend
gains from a duplicate): multiple choice (``--items`` verses cut at a word, the next three words
and three other verses' words there as choices; ``--items`` / 2 verses with four one-token
answers, as in a lettered benchmark, where both backends score an item's choices from one
forward pass; ``loglikelihood``) and rolling perplexity (``--items`` / 4 documents of eight
verses, each longer than the context, ``loglikelihood_rolling``). After ``--warmup`` untimed
rounds, ``--rounds`` rounds time each backend once on all requests, in alternating order.
Printed: each backend's seconds per round (median [min, max]); the per-round ratio hf / duolm
(above 1: duolm is faster), its median and min; the largest per-request difference between the
two (a check that they did the same work); the machine, its load average and the versions.
Measure on an idle machine: the ratio is paired within rounds, but two engineers' tests beside
it still move it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from arlm.export import export_checkpoint  # noqa: E402
from eval.harness import DuoLM  # noqa: E402
from shared.checkpoint import read_state, resolve_checkpoint  # noqa: E402
from shared.cli_args import CommandParser
from shared.data.corpus import load_corpus  # noqa: E402
from shared.hardware import cpu_name  # noqa: E402
from shared.training import cli  # noqa: E402

CHOICES = 4  # the true continuation and three others', as in a four-way benchmark
# the letters of the one-token items: the first four of these that are one token of the run's
# tokenizer (the spaced ones for a BPE, the bare ones for bytes)
ONE_TOKEN_CANDIDATES = (" A", " B", " C", " D", "A", "B", "C", "D")


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=None, help="an AR run (default: train one step)")
    parser.add_argument("--preset", default="demo-d256", help="the shape trained without --run")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=None, help="default: the run's rows")
    parser.add_argument("--items", type=int, default=100, help="multiple-choice items")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    for name in ("batch_size", "items", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.warmup < 0:
        parser.error(f"--warmup={args.warmup} must be >= 0")
    return args


def trained_run(preset: str, folder: Path) -> Path:
    run = folder / "ar"
    cli.train_from_argv(
        ["--preset", preset, "--objective", "ar", "--out", str(run), "--max-steps", "1"]
        + ["--eval-every", "1000", "--sliding-window", "0"]
    )
    return run


def one_token_answers(tokenizer) -> list[str]:
    answers = [a for a in ONE_TOKEN_CANDIDATES if len(tokenizer.encode(a)) == 1][:CHOICES]
    if len(answers) < CHOICES:
        raise SystemExit(f"the run's tokenizer has fewer than {CHOICES} one-token answers")
    return answers


def requests(run: Path, items: int, tokenizer) -> tuple[list[Instance], list[Instance]]:
    """Likelihood requests on distinct held-out verses (no request repeats, so neither backend
    is helped by a duplicate): multiple choice with multi-token answers (``items``), with
    one-token answers (``items`` / 2, as in a lettered benchmark, where one forward pass serves
    an item's choices in both backends), and rolling documents (``items`` / 4 of 8 verses)."""
    config = read_state(resolve_checkpoint(run))["train_config"]
    chapters = load_corpus(config["dataset"]).validation
    verses = list(dict.fromkeys(line for text in chapters for line in text.splitlines()))
    verses = [verse for verse in verses if len(verse.split()) >= 6]
    multi, single, documents = items, max(1, items // 2), max(1, items // 4)
    needed = multi + single + 8 * documents
    if len(verses) < needed:
        raise SystemExit(
            f"--items {items} needs {needed} distinct verses; the corpus has {len(verses)}"
        )
    choice = []
    for i, verse in enumerate(verses[:multi]):
        words = verse.split()
        cut = len(words) * 3 // 5
        context = " ".join(words[:cut])
        for k in range(CHOICES):
            other = verses[(i + k * 7) % multi].split()
            rest = " " + " ".join((words if k == 0 else other)[cut : cut + 3] or other[-3:])
            choice.append(Instance("loglikelihood", {}, (context, rest), idx=k))
    for verse in verses[multi : multi + single]:
        context = verse + "\nAnswer:"
        for k, answer in enumerate(one_token_answers(tokenizer)):
            choice.append(Instance("loglikelihood", {}, (context, answer), idx=k))
    rest = verses[multi + single : needed]
    texts = [" ".join(rest[i : i + 8]) for i in range(0, 8 * documents, 8)]
    rolling = [Instance("loglikelihood_rolling", {}, (text,), idx=0) for text in texts]
    return choice, rolling


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{cpu_name()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"load average {load}"
    )


def versions() -> str:
    names = ("torch", "transformers", "lm_eval")
    found = ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)
    return f"python {platform.python_version()}, {found}"


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)  # hf's truncation warnings, once per long request
    scratch = Path(tempfile.mkdtemp(prefix="lm-eval-speed-"))
    run = Path(args.run) if args.run else trained_run(args.preset, scratch)
    export = scratch / "export"
    export_checkpoint(str(run), str(export), False)
    ours = DuoLM(
        str(run), batch_size=args.batch_size, max_length=args.max_length, device=args.device
    )
    theirs = HFLM(
        pretrained=str(export),
        device=args.device,
        dtype="float32",
        batch_size=args.batch_size,
        max_length=ours.max_length,
    )
    choice, rolling = requests(run, args.items, ours.tokenizer)
    print(f"machine: {machine()}")
    print(f"versions: {versions()}")
    print(
        f"run: {run} ({ours.model.num_parameters() / 1e6:.2f}M parameters), max_length "
        f"{ours.max_length}, batch {args.batch_size}, {len(choice)} choice requests "
        f"(multi-token and one-token answers) and {len(rolling)} rolling, none repeated, "
        f"device {args.device}"
    )

    def timed(lm) -> tuple[float, list[float]]:
        start = time.perf_counter()
        # hf's rolling path draws a progress bar per batch whatever disable_tqdm says
        with contextlib.redirect_stderr(io.StringIO()):
            scores = [s for s, _ in lm.loglikelihood(choice, disable_tqdm=True)]
            scores += lm.loglikelihood_rolling(rolling, disable_tqdm=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start, scores

    backends = {"duolm": ours, "hf": theirs}
    seconds: dict[str, list[float]] = {name: [] for name in backends}
    difference = 0.0
    for index in range(args.warmup + args.rounds):
        order = list(backends) if index % 2 == 0 else list(reversed(backends))
        took = {name: timed(backends[name]) for name in order}
        difference = max(difference, *(abs(a - b) for a, b in zip(took["duolm"][1], took["hf"][1])))
        if index >= args.warmup:
            for name in backends:
                seconds[name].append(took[name][0])
    for name, values in seconds.items():
        print(
            f"{name:6s} {statistics.median(values):.3f} s per round "
            f"[{min(values):.3f}, {max(values):.3f}] over {len(values)} rounds"
        )
    ratios = [h / d for h, d in zip(seconds["hf"], seconds["duolm"])]
    print(
        f"hf / duolm: median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x "
        f"(above 1: duolm is faster)"
    )
    print(f"largest per-request difference duolm - hf: {difference:.2e} nats")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
