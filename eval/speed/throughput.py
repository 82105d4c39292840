"""Generation throughput measured the same way everywhere: the report, the frontier and bench/.

    settings = [Setting("ar T=1", 64, lambda: ar_batch()), Setting("mdm 16 steps", 64, ...)]
    result = measure(settings, rounds=5)
    result.records[0].tokens_per_s.median, result.machine

A setting is a name, a batch size and a zero-argument callable that generates one batch and
returns how many *generated* tokens it produced (prompt, BOS and padding excluded). Timing one
setting once, cold, is what made the same AR model read 10,226 tokens/s when it was timed first
and 21,406 when it was timed later in one report; so the measurement

- runs ``warmup`` untimed rounds of every setting first (allocation, kernel selection, caches);
- then ``rounds`` timed rounds in which every setting runs once, round-robin, the order rotated
  by one each round, so that no setting always runs first or right after the same neighbour
  (drifts of the machine, such as a clock or another process, spread over all settings);
- reports the median over rounds with the min and max, generated tokens only in the numerator,
  wall time per sample (a round's seconds over the batch size), and the batch size.

The clock is injected (``clock=time.perf_counter`` by default), so tests drive it with a fake
clock and check the alternation and the arithmetic exactly. ``measure_batches`` runs the same
comparison at several batch sizes (at least 1 and a large one); a batch that does not fit in
memory becomes one line naming the largest batch that fitted, not an error. Every result records
the machine (CPU model, cores, torch threads, GPU) and library versions.

The host's own speed moves between runs on a shared machine (a KVM guest here drifted by up to
30% between runs minutes apart), and a run cannot tell that from its own numbers. So ``probes``
(``host_probes()``: a fixed matrix product, compute-bound, and a loop of tiny tensor operations,
bound by per-operation overhead) join the rotation of every round and are recorded beside the
settings, counted in operations per second. They measure the host, not a model: two runs whose
settings disagree while their probes agree point at the measurement; probes that moved as well
point at the host (``eval.speed.throughput_runs`` compares two runs this way).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from shared.hardware import cpu_name

Clock = Callable[[], float]
# What a batch that does not fit raises: CUDA's allocator error, or the host's.
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


@dataclass(frozen=True)
class Setting:
    """One thing to time: ``run()`` generates a batch of ``batch_size`` samples and returns the
    number of generated tokens in it (a sampler that stops at EOS returns what it generated)."""

    name: str
    batch_size: int
    run: Callable[[], int]


@dataclass(frozen=True)
class Spread:
    """Median over the timed rounds, with the smallest and largest value."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class Record:
    """The measured speed of one setting at one batch size.

    ``tokens_per_s``: generated tokens / wall seconds, per round (median, min, max).
    ``seconds_per_sample``: a round's wall seconds / ``batch_size`` (median, min, max).
    ``round_seconds``, ``round_tokens``: every timed round, in round order.
    ``positions``: where the setting ran within each round (0 = first), to show the rotation.
    """

    name: str
    batch_size: int
    rounds: int
    warmup: int
    tokens_per_s: Spread
    seconds_per_sample: Spread
    round_seconds: list[float]
    round_tokens: list[int]
    positions: list[int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Throughput:
    """Records of one comparison at one or more batch sizes, the machine, and what did not run."""

    records: list[Record]
    machine: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # The host probes timed in the same rounds, one record per probe and batch size (the batch
    # whose settings they alternated with); their "tokens" are operations.
    probes: list[Record] = field(default_factory=list)
    # What was measured, so that two runs can be checked to have measured the same thing: the
    # preset, each model's shape, the generation length and prompt, the sampler settings, the
    # batch sizes and rounds (``eval.experiments.compare_speed.measured_setup``); empty in a
    # measurement written before it was recorded, or one made outside a comparison.
    setup: dict[str, Any] = field(default_factory=dict)
    # A measurement pooled from several fresh processes (``merge_runs``) keeps each process's
    # own run here: what a setting's ratio to the AR is replicated over (``eval.speed.ratios``).
    # Empty for one process's run.
    processes: list[Throughput] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data = {
            "records": [r.as_dict() for r in self.records],
            "machine": self.machine,
            "notes": list(self.notes),
            "probes": [r.as_dict() for r in self.probes],
            "setup": dict(self.setup),
        }
        if self.processes:
            data["processes"] = [run.as_dict() for run in self.processes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Throughput:
        """The measurement ``as_dict`` wrote (a stored stage read back; one written before the
        probes or the setup existed reads back with none)."""

        def record(r: dict[str, Any]) -> Record:
            return Record(
                **{
                    **r,
                    "tokens_per_s": Spread(**r["tokens_per_s"]),
                    "seconds_per_sample": Spread(**r["seconds_per_sample"]),
                }
            )

        return cls(
            [record(r) for r in data["records"]],
            data["machine"],
            list(data.get("notes", [])),
            [record(r) for r in data.get("probes", [])],
            dict(data.get("setup", {})),
            [cls.from_dict(run) for run in data.get("processes", [])],
        )

    def record(self, name: str, batch_size: int) -> Record:
        for r in self.records:
            if r.name == name and r.batch_size == batch_size:
                return r
        raise KeyError(f"no record for {name!r} at batch {batch_size}")

    def markdown(self) -> str:
        """A table of every record (tokens/s median [min, max], seconds per sample), then the
        machine and the notes."""
        lines = [
            "| setting | batch | tokens/s median [min, max] | s / sample (median) | rounds |",
            "| --- | ---: | --- | ---: | ---: |",
        ]
        for r in self.records:
            t = r.tokens_per_s
            lines.append(
                f"| {r.name} | {r.batch_size} | {t.median:,.0f} [{t.low:,.0f}, {t.high:,.0f}] | "
                f"{r.seconds_per_sample.median:.4g} | {r.rounds} |"
            )
        m = self.machine
        lines.append("")
        lines.append(
            f"Machine: {m['cpu']}, {m['cpu_count']} cores, {m['torch_threads']} torch threads, "
            f"GPU: {m['gpu'] or 'none'}; "
            + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
            + f". {self.records[0].warmup if self.records else 0} untimed warm-up round(s), "
            "then round-robin "
            "rounds with the order rotated each round; generated tokens only."
        )
        if self.probes:
            lines.append(
                "Host probes timed in the same rounds (operations/s median [min, max]): "
                + "; ".join(
                    f"{p.name} at batch {p.batch_size} {p.tokens_per_s.median:,.0f} "
                    f"[{p.tokens_per_s.low:,.0f}, {p.tokens_per_s.high:,.0f}]"
                    for p in self.probes
                )
                + "."
            )
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)


def machine() -> dict[str, Any]:
    """CPU model, cores, torch threads, GPU name and the versions that set the speed."""

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "platform": platform.platform(),
        "versions": {"python": platform.python_version(), "torch": version("torch")},
    }


def rotation(count: int, round_index: int) -> list[int]:
    """The order of ``count`` settings in a round: the list rotated left by ``round_index``."""
    shift = round_index % count
    return list(range(shift, count)) + list(range(shift))


def check_settings(settings: Sequence[Setting], rounds: int, warmup: int) -> None:
    if not settings:
        raise ValueError("nothing to measure: give at least one setting")
    names = [(s.name, s.batch_size) for s in settings]
    if len(set(names)) != len(names):
        raise ValueError(f"settings must have distinct (name, batch size) pairs, got {names}")
    for s in settings:
        if isinstance(s.batch_size, bool) or not isinstance(s.batch_size, int) or s.batch_size < 1:
            raise ValueError(f"{s.name}: batch_size={s.batch_size!r} must be an integer >= 1")
        if not callable(s.run):
            raise ValueError(f"{s.name}: run must be a zero-argument callable")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an integer >= 1 (3 or more for a median)")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")


def generated_tokens(setting: Setting) -> int:
    """Run a setting once and check what it says it generated."""
    tokens = setting.run()
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(
            f"{setting.name}: run() must return the number of generated tokens (an int >= 0), "
            f"got {tokens!r}"
        )
    return tokens


def record_of(
    name: str,
    batch_size: int,
    warmup: int,
    seconds: list[float],
    tokens: list[int],
    positions: list[int],
) -> Record:
    """A setting's record from its timed rounds: tokens/s and seconds per sample per round,
    summarised by their median, min and max."""
    return Record(
        name=name,
        batch_size=batch_size,
        rounds=len(seconds),
        warmup=warmup,
        tokens_per_s=Spread.of([n / t for n, t in zip(tokens, seconds)]),
        seconds_per_sample=Spread.of([t / batch_size for t in seconds]),
        round_seconds=seconds,
        round_tokens=tokens,
        positions=positions,
    )


def measure(
    settings: Sequence[Setting],
    *,
    rounds: int = 5,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] | None = None,
    probes: Sequence[Setting] = (),
) -> Throughput:
    """Time every setting ``rounds`` times, round-robin with the order rotated each round, after
    ``warmup`` untimed rounds; see the module docstring. ``sync`` runs before each clock reading
    (pass ``torch.cuda.synchronize`` on a GPU so that queued kernels are inside the timing).
    ``probes`` (e.g. ``host_probes()``) are timed in the same rotation and returned apart, in
    ``Throughput.probes``."""
    check_settings(settings, rounds, warmup)
    timed = [*settings, *probes]
    check_settings(timed, rounds, warmup)
    wait = sync or (lambda: None)
    for _ in range(warmup):
        for setting in timed:
            generated_tokens(setting)
    seconds: list[list[float]] = [[] for _ in timed]
    tokens: list[list[int]] = [[] for _ in timed]
    positions: list[list[int]] = [[] for _ in timed]
    for round_index in range(rounds):
        for position, i in enumerate(rotation(len(timed), round_index)):
            wait()
            start = clock()
            count = generated_tokens(timed[i])
            wait()
            elapsed = clock() - start
            if elapsed <= 0:
                raise ValueError(
                    f"{timed[i].name}: the clock did not advance ({elapsed} s); "
                    "use a clock with a finer resolution"
                )
            seconds[i].append(elapsed)
            tokens[i].append(count)
            positions[i].append(position)
    records = [
        record_of(s.name, s.batch_size, warmup, seconds[i], tokens[i], positions[i])
        for i, s in enumerate(timed)
    ]
    return Throughput(records[: len(settings)], machine(), probes=records[len(settings) :])


def measure_batches(
    make: Callable[[str, int], Callable[[], int]],
    names: Sequence[str],
    batch_sizes: Sequence[int],
    *,
    rounds: int = 5,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] | None = None,
    out_of_memory: tuple[type[BaseException], ...] = OUT_OF_MEMORY,
    probes: Sequence[Setting] = (),
) -> Throughput:
    """The same comparison at each batch size, smallest first: ``make(name, batch)`` builds the
    callable for a setting. Settings are compared (alternated) within a batch size. A batch size
    whose warm-up or rounds run out of memory is skipped with one note naming the largest batch
    size that fitted (or saying none did); the larger ones are not tried. ``probes`` run in the
    rounds of every batch size, each recorded under the batch size it alternated with."""
    sizes = sorted(set(batch_sizes))
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch_sizes={list(batch_sizes)!r} must be integers >= 1")
    records: list[Record] = []
    probe_records: list[Record] = []
    notes: list[str] = []
    fitted: int | None = None
    for batch in sizes:
        settings = [Setting(name, batch, make(name, batch)) for name in names]
        alongside = [Setting(p.name, batch, p.run) for p in probes]
        try:
            result = measure(
                settings, rounds=rounds, warmup=warmup, clock=clock, sync=sync, probes=alongside
            )
        except out_of_memory:
            largest = f"the largest that fits is {fitted}" if fitted else "no batch size fitted"
            notes.append(
                f"batch {batch} does not fit in memory ({largest}); "
                f"larger batches ({[b for b in sizes if b > batch] or 'none'}) were not tried"
            )
            break
        records += result.records
        probe_records += result.probes
        fitted = batch
    return Throughput(records, machine(), notes, probe_records)


def merge_runs(runs: Sequence[Throughput]) -> Throughput:
    """One measurement from several runs of the same settings (e.g. in separate fresh processes,
    so that the stated spread covers what changes from one process to the next, not only from
    one round to the next): each record's rounds are pooled in run order and its median, min and
    max taken over all of them; the runs themselves are kept (``Throughput.processes``), as the
    ratios to the AR are replicated over them. Records are matched by (name, batch size); one
    missing from any run is refused, as the pooled spread would silently cover fewer runs, and
    so are runs whose recorded setups differ (they measured different models or settings)."""
    if not runs:
        raise ValueError("nothing to merge: give at least one measurement")
    if any(run.setup != runs[0].setup for run in runs):
        raise ValueError("the runs recorded different setups: they measured different things")

    def pooled(lists: list[list[Record]]) -> list[Record]:
        keys = [[(r.name, r.batch_size) for r in records] for records in lists]
        if any(k != keys[0] for k in keys):
            raise ValueError(f"the runs measured different settings: {keys}")
        merged = []
        for parts in zip(*lists):
            first = parts[0]
            merged.append(
                record_of(
                    first.name,
                    first.batch_size,
                    first.warmup,
                    [t for r in parts for t in r.round_seconds],
                    [n for r in parts for n in r.round_tokens],
                    [i for r in parts for i in r.positions],
                )
            )
        return merged

    notes = list(dict.fromkeys(note for run in runs for note in run.notes))
    return Throughput(
        pooled([run.records for run in runs]),
        runs[0].machine,
        notes,
        pooled([run.probes for run in runs]),
        dict(runs[0].setup),
        list(runs),
    )


# The host probes' sizes: each takes a few tens of milliseconds on a 2-core CPU, small beside a
# round of the settings it alternates with, long enough for the clock.
PROBE_MATMUL_SIZE = 384
PROBE_MATMUL_REPEATS = 16
PROBE_DISPATCH_REPEATS = 2000
PROBE_MATMUL = "host probe: matmul"
PROBE_DISPATCH = "host probe: dispatch"


def host_probes(seed: int = 0) -> list[Setting]:
    """Two fixed workloads that measure the host rather than a model, each returning the number
    of operations it ran: ``PROBE_MATMUL_REPEATS`` float32 products of two seeded
    ``PROBE_MATMUL_SIZE``-square matrices on the CPU with the process's torch threads (bound by
    arithmetic, like a diffusion step over a whole canvas), and ``PROBE_DISPATCH_REPEATS``
    additions on an 8-element tensor (bound by per-operation overhead, like batch-1 decoding of
    a small model)."""
    generator = torch.Generator().manual_seed(seed)
    left = torch.randn(PROBE_MATMUL_SIZE, PROBE_MATMUL_SIZE, generator=generator)
    right = torch.randn(PROBE_MATMUL_SIZE, PROBE_MATMUL_SIZE, generator=generator)
    small = torch.zeros(8)

    def matmul() -> int:
        for _ in range(PROBE_MATMUL_REPEATS):
            torch.mm(left, right)
        return PROBE_MATMUL_REPEATS

    def dispatch() -> int:
        for _ in range(PROBE_DISPATCH_REPEATS):
            torch.add(small, 1.0)
        return PROBE_DISPATCH_REPEATS

    return [Setting(PROBE_MATMUL, 1, matmul), Setting(PROBE_DISPATCH, 1, dispatch)]
