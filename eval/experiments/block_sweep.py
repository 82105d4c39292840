"""Block-size sweep: AR, block diffusion at several block sizes, and MDM, from one preset.

    python -m eval.experiments.block_sweep --preset smoke --out runs/sweep-smoke \\
        --block-sizes 4,16 [--force] [training overrides such as --max-steps 20 ...]

Block diffusion interpolates between the two ends of the comparison: block size 1 is
autoregressive decoding and one block the size of the row is masked diffusion. This job trains
AR, MDM and a bd model per block size from the same preset under the same token budget (same
steps, batch and sequence length) into ``<out>/ar``, ``<out>/mdm`` and ``<out>/bd-<size>``,
reusing finished runs unless ``--force``. Then, each stage resumable under ``<out>/stages/``:

1. likelihood  AR exact NLL, MDM and bd NELBO (with intervals) on the same validation rows;
2. generate    the same number of unconditional samples of the same length from every model:
               AR KV-cached at temperature 1, MDM ancestral with one step per generated token,
               bd ancestral with ``block_size`` steps per block and the exact KV cache of
               finished blocks; NFE and wall time;
3. quality     judge perplexity and diversity statistics (``eval.quality``);

then ``<out>/report.md``, ``report.json`` and two plots against block size (log2 axis, AR placed
at block size 1 and MDM at block size = seq_len).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlm.generate import ARGenerator
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral
from eval.experiments.stages import (
    Stages,
    check_equal_budgets,
    held_out,
    load,
    locked_job,
    run_stoppable,
    train_or_reuse,
    training_overrides,
    training_seed,
)
from eval.likelihood import evaluate_checkpoint
from eval.quality import load_judge
from eval.report import Report, Table, frontier_figure
from eval.sample_sets import (
    EOS_POLICY,
    PERPLEXITY_DEFINITION,
    ar_sample_set,
    diffusion_sample_set,
    judged,
)
from shared.cli_args import CommandParser
from shared.faults import StopRequest
from shared.sampling import SamplingConfig
from shared.training import resolve_config


@dataclass(frozen=True)
class SweepSettings:
    """What the evaluation stages of the sweep do."""

    block_sizes: tuple[int, ...] = (4, 16, 32)
    samples: int = 32  # unconditional samples per model
    gen_length: int = 64  # generated tokens per sample (BOS + gen_length must fit seq_len)
    nelbo_samples: int = 4  # noise draws per validation row (MDM and bd)
    max_val_rows: int = 0  # 0 = the whole validation split
    judge: str = "smollm2"


SWEEP_PRESETS = {
    "smoke": SweepSettings(
        block_sizes=(4, 16), samples=4, gen_length=24, nelbo_samples=2, max_val_rows=32
    ),
    "demo": SweepSettings(block_sizes=(4, 16, 32), samples=32, gen_length=64, nelbo_samples=4),
}


def sweep_settings_for(preset: str, max_seq_len: int | None = None) -> SweepSettings:
    """The sweep's settings for a training preset (the demo's by default); with
    ``max_seq_len``, samples shrink so that BOS and the generated tokens fit the model."""
    settings = SWEEP_PRESETS.get(preset, SWEEP_PRESETS["demo"])
    if max_seq_len is None or settings.gen_length < max_seq_len:
        return settings
    return dataclasses.replace(settings, gen_length=max_seq_len - 1)


def run_names(block_sizes: tuple[int, ...]) -> list[str]:
    """The run directories under ``<out>``: AR, the bd runs from small to large blocks, MDM."""
    return ["ar", *(f"bd-{size}" for size in block_sizes), "mdm"]


def parse_block_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--block-sizes={text!r} must be comma-separated integers") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--block-sizes={text!r} must list positive integers")
    return tuple(sizes)


# ---------------------------------------------------------------- training


def train_all(
    preset: str,
    out: Path,
    overrides: dict[str, Any],
    block_sizes: tuple[int, ...],
    force: bool,
) -> dict[str, dict[str, Any]]:
    """Train every run of the sweep (same preset, overrides and so token budget), reusing finished
    runs and resuming interrupted ones like ``stages.train_both``."""
    summaries = {}
    for name in run_names(block_sizes):
        objective = "bd" if name.startswith("bd-") else name
        start: dict[str, Any] = {"objective": objective}
        if objective == "bd":
            start["block_size"] = int(name.removeprefix("bd-"))
        summaries[name] = train_or_reuse(name, out / name, preset, start, overrides, force)
    return summaries


# ---------------------------------------------------------------- evaluation stages


def likelihood_stage(out: Path, names: list[str], settings: SweepSettings) -> dict[str, Any]:

    return {
        name: evaluate_checkpoint(
            str(out / name),
            samples=settings.nelbo_samples,
            max_rows=settings.max_val_rows,
            batch_size=32,
        )
        for name in names
    }


def main_estimate(result: dict[str, Any]) -> dict[str, Any]:
    """The headline estimate of one likelihood result: exact NLL (AR) or the NELBO."""
    estimates = result["estimates"]
    return estimates["nll"] if "nll" in estimates else estimates["nelbo"]


def generation_stage(out: Path, names: list[str], settings: SweepSettings) -> dict[str, Any]:
    """The same number of unconditional samples of the same length from every model, drawn the
    one way (``eval.sample_sets``: every model's samples end at their first EOS)."""
    length, count = settings.gen_length, settings.samples
    sets: dict[str, dict[str, Any]] = {}
    for name in names:
        model, tokenizer, state = load(out, name)
        objective = state["objective"]
        if objective == "ar":
            engine = ARGenerator(model, tokenizer)
            drawn = ar_sample_set(engine, count, length, SamplingConfig(temperature=1.0), seed=0)
            sets[name] = drawn.record() | {
                "objective": "ar",
                "block_size": 1,
                "sampler": "kv-cached ancestral, T=1",
            }
            continue
        generator = DiffusionGenerator(model, tokenizer, state)
        canvas = generator.prompt_canvas([[]] * count, length)
        # One step per generated token (MDM), per position of the blocks that cover them (bd).
        steps = generator.steps_per_position(canvas)
        if objective == "mdm":
            block_size = int(state["train_config"]["seq_len"])
            sampler = f"ancestral, {steps} steps"
        else:
            block_size = generator.block_size
            sampler = f"ancestral, {block_size} steps per block, exact KV cache"
        # Every block is decoded (early_stop=False), so NFE measures whole-length sampling.
        drawn = diffusion_sample_set(
            generator, SamplerConfig(Ancestral(steps)), count, length, seed=0, early_stop=False
        )
        sets[name] = drawn.record() | {
            "objective": objective,
            "block_size": block_size,
            "sampler": sampler,
        }
    for entry in sets.values():
        entry["seconds_per_sample"] = entry["seconds"] / count
        entry["nfe_per_token"] = entry["nfe"] / length
    return sets


def quality_stage(out: Path, sets: dict[str, Any], settings: SweepSettings) -> dict[str, Any]:
    """Every model's samples and held-out documents (cut as the samples are) judged the one
    way (``eval.sample_sets.judged``)."""
    judge = load_judge(settings.judge)
    count = max(settings.samples, 2)
    reference_ids, references, _ = held_out(out, count, settings.gen_length)
    scores: dict[str, Any] = {"judge": judge.identity, "eos_policy": EOS_POLICY, "sets": {}}
    scores["perplexity"] = PERPLEXITY_DEFINITION
    scores["reference"] = judged(judge, references, reference_ids)
    for name, entry in sets.items():
        scores["sets"][name] = judged(judge, entry["texts"], entry["ids"])
    return scores


# ---------------------------------------------------------------- the report


def label(name: str, seq_len: int) -> str:
    if name == "ar":
        return "AR (block size 1)"
    if name == "mdm":
        return f"MDM (block size = seq_len = {seq_len})"
    return f"BD block size {name.removeprefix('bd-')}"


def sweep_figure(points: dict[str, tuple[float, float]], seq_len: int, ylabel: str, title: str):
    """Value against block size on a log2 axis: one line through AR, the bd runs and MDM, with
    the two ends marked and labelled."""

    bd = [xy for name, xy in points.items() if name.startswith("bd-")]
    curves = {"block diffusion": bd} if bd else {}
    curves |= {label(name, seq_len): [points[name]] for name in ("ar", "mdm") if name in points}
    figure = frontier_figure(curves, xlabel="block size (log2)", ylabel=ylabel, title=title)
    axis = figure.axes[0]
    ordered = sorted(points.values())
    axis.plot(
        [x for x, _ in ordered], [y for _, y in ordered], color="grey", ls=":", lw=1, zorder=0
    )
    axis.set_xscale("log", base=2)
    ticks = sorted({x for x, _ in points.values()})
    names = {1: "1\n(AR)", seq_len: f"{seq_len}\n(MDM)"}
    axis.set_xticks(ticks, [names.get(int(x), str(int(x))) for x in ticks])
    axis.minorticks_off()
    return figure


def write_report(
    out: Path,
    preset: str,
    summaries: dict[str, Any],
    likelihood: dict[str, Any],
    sets: dict[str, Any],
    quality: dict[str, Any],
    settings: SweepSettings,
    wall_seconds: float,
    reused: list[str],
) -> dict[str, Path]:
    """``report.md``, ``report.json`` and the two plots of the sweep under ``out``."""
    names = list(sets)
    seq_len = int(likelihood["ar"]["protocol"]["seq_len"])
    report = Report(
        f"Block-size sweep: AR, block diffusion and MDM, preset `{preset}`",
        out,
        config={
            "preset": preset,
            "settings": dataclasses.asdict(settings),
            "training": {k: v["data"] | {"steps": v["step"]} for k, v in summaries.items()},
        },
        seeds={"train": training_seed(out / "ar"), "sampling": 0},
    )
    report.text(introduction(seq_len, summaries, settings, wall_seconds, reused))
    rows = {
        label(name, seq_len): main_estimate(likelihood[name])
        | {"protocol": likelihood[name]["protocol"]}
        for name in names
    }
    report.likelihood_table("Validation likelihood (same rows, same protocol)", rows)
    report.table(per_model_table(names, seq_len, likelihood, sets, quality))
    add_plots(report, names, seq_len, likelihood, sets, quality)
    report.results.update(
        {
            "sweep": sweep_results(names, likelihood, sets, quality),
            "likelihood_raw": likelihood,
            "generation": {k: {x: v for x, v in e.items() if x != "ids"} for k, e in sets.items()},
            "quality": quality,
            "training": summaries,
            "wall_seconds": wall_seconds,
        }
    )
    return report.write()


def introduction(
    seq_len: int,
    summaries: dict[str, Any],
    settings: SweepSettings,
    wall_seconds: float,
    reused: list[str],
) -> str:
    """What the sweep places where, what every model saw, how it sampled, what was reused."""
    return (
        "Block diffusion with block size 1 is autoregressive and with one block per row it is "
        f"masked diffusion; AR and MDM are placed at block sizes 1 and {seq_len} below. Every "
        f"model saw {summaries['ar']['tokens_seen']:,} training tokens of the same preset. "
        f"Samples: {settings.samples} unconditional x {settings.gen_length} tokens each, at "
        "temperature 1 (AR KV-cached; MDM ancestral, one step per token; bd ancestral, "
        "block-size steps per block with the exact KV cache). Wall time of this invocation: "
        f"{wall_seconds / 60:.1f} min"
        + (f" (reused: {', '.join(reused)})." if reused else ", every stage computed.")
    )


def per_model_table(
    names: list[str],
    seq_len: int,
    likelihood: dict[str, Any],
    sets: dict[str, Any],
    quality: dict[str, Any],
) -> Table:
    """One row per model (likelihood, sample quality, cost), then the held-out text's row."""
    rows = []
    for name in names:
        estimate, entry, q = main_estimate(likelihood[name]), sets[name], quality["sets"][name]
        rows.append(
            [
                label(name, seq_len),
                entry["block_size"],
                estimate["kind"],
                estimate["nats_per_token"],
                estimate["bits_per_byte"],
                q["judge_ppl"],
                q["unigram_entropy"],
                q["distinct_2"],
                entry["nfe"],
                entry["seconds_per_sample"],
            ]
        )
    reference = quality["reference"]
    rows.append(
        [
            "held-out text",
            "-",
            "-",
            "-",
            "-",
            reference["judge_ppl"],
            "-",
            reference["distinct_2"],
            "-",
            "-",
        ]
    )
    return Table(
        "Per model",
        [
            "model",
            "block size",
            "estimate",
            "nats/token",
            "bits/byte",
            "judge ppl",
            "unigram entropy",
            "distinct-2",
            "NFE",
            "s/sample",
        ],
        rows,
        note=f"Judge: {quality['judge']}. NLL is exact (AR); NELBO is an upper bound on the "
        "NLL (MDM, bd). NFE counts network evaluations per batch of samples; s/sample is the "
        "batch's wall time over the sample count.",
    )


def add_plots(
    report: Report,
    names: list[str],
    seq_len: int,
    likelihood: dict[str, Any],
    sets: dict[str, Any],
    quality: dict[str, Any],
) -> None:
    """Likelihood and judge perplexity against block size."""
    nats = {
        n: (sets[n]["block_size"], main_estimate(likelihood[n])["nats_per_token"]) for n in names
    }
    judged = {n: (sets[n]["block_size"], quality["sets"][n]["judge_ppl"]) for n in names}
    report.plot(
        "sweep_likelihood",
        sweep_figure(nats, seq_len, "validation nats/token", "Likelihood vs block size"),
        "Validation nats/token (AR exact NLL; bd and MDM NELBO) vs block size",
    )
    report.plot(
        "sweep_judge",
        sweep_figure(judged, seq_len, "judge perplexity", "Sample quality vs block size"),
        "Judge perplexity of unconditional samples vs block size",
    )


def sweep_results(
    names: list[str], likelihood: dict[str, Any], sets: dict[str, Any], quality: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The headline numbers of every model, by run name, for ``report.json``."""
    return {
        name: {
            "block_size": sets[name]["block_size"],
            "objective": sets[name]["objective"],
            "nats_per_token": main_estimate(likelihood[name])["nats_per_token"],
            "bits_per_byte": main_estimate(likelihood[name])["bits_per_byte"],
            "judge_ppl": quality["sets"][name]["judge_ppl"],
            "unigram_entropy": quality["sets"][name]["unigram_entropy"],
            "nfe": sets[name]["nfe"],
            "seconds_per_sample": sets[name]["seconds_per_sample"],
        }
        for name in names
    }


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="demo")
    parser.add_argument(
        "--out", default=None, help="output directory (default runs/sweep-<preset>)"
    )
    parser.add_argument(
        "--block-sizes",
        default=None,
        help="comma-separated bd block sizes, each dividing seq_len (default: the preset's)",
    )
    parser.add_argument("--force", action="store_true", help="retrain and redo every stage")
    parser.add_argument("--judge", default=None, help="judge model (default: smollm2 wheel)")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out or f"runs/sweep-{args.preset}")
    started = time.perf_counter()

    def job(stop: StopRequest) -> None:
        overrides = training_overrides(extra)
        max_seq_len = resolve_config(args.preset, overrides)[0].max_seq_len
        settings = sweep_settings_for(args.preset, max_seq_len)
        if args.block_sizes:
            settings = dataclasses.replace(
                settings, block_sizes=parse_block_sizes(args.block_sizes)
            )
        if args.judge:
            settings = dataclasses.replace(settings, judge=args.judge)
        summaries = train_all(args.preset, out, overrides, settings.block_sizes, args.force)
        names = run_names(settings.block_sizes)
        check_equal_budgets(summaries, "tokens")
        stages = Stages(out, args.force, stop)
        key = {
            "train": {k: (v["step"], v.get("val_nats_per_token")) for k, v in summaries.items()},
            "settings": dataclasses.asdict(settings),
        }
        likelihood = stages.run("likelihood", key, lambda: likelihood_stage(out, names, settings))
        sets = stages.run("generate", key, lambda: generation_stage(out, names, settings))
        quality = stages.run("quality", key, lambda: quality_stage(out, sets, settings))
        paths = write_report(
            out,
            args.preset,
            summaries,
            likelihood,
            sets,
            quality,
            settings,
            time.perf_counter() - started,
            [f"train {k}" for k, v in summaries.items() if v.get("reused")] + stages.reused,
        )
        for name in names:
            estimate = main_estimate(likelihood[name])
            print(
                f"{name:>8}  {estimate['nats_per_token']:.4f} nats/token ({estimate['kind']}), "
                f"judge ppl {quality['sets'][name]['judge_ppl']:.1f}"
            )
        print(f"report: {paths['markdown']} ({(time.perf_counter() - started) / 60:.1f} min)")

    return run_stoppable(locked_job(out, args.force, job, "sweep job"))


if __name__ == "__main__":
    sys.exit(main())
