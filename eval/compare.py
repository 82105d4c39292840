"""The main job: train an AR and an MDM model from one preset and compare them side by side.

    python -m eval.compare --preset demo --out runs/demo [--force] [--budget tokens|flops]
                           [training overrides such as --max-steps 800 ...]

Stages, each resumable (its result is stored under ``<out>/stages/`` and reused by a rerun with
the same settings; ``--force`` redoes everything):

1. train   both objectives from the same preset, corpus, tokenizer, seed and budget;
2. likelihood  AR exact NLL and MDM NELBO (with its interval) on the same validation rows, in
               bits per byte; the MDM's exact left-to-right NLL on a few rows;
3. generate    unconditional samples: KV-cached AR decoding and the diffusion samplers at
               several step counts, plus a temperature sweep; NFE, wall time, FLOPs per token;
4. quality     judge perplexity, unigram entropy, distinct-n, repetition, MAUVE vs held-out text;
5. examples    the same prompts through both models, and an infilling example only the MDM can do;

then ``<out>/report.md``, ``report.json`` and the plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import Ancestral, FixedCount, Threshold
from shared.sampling import SamplingConfig

OBJECTIVES = ("ar", "mdm")


@dataclass(frozen=True)
class CompareSettings:
    """What the evaluation stages do; presets pick values that fit their time budget."""

    samples: int = 32  # unconditional samples per generation setting
    gen_length: int = 64  # generated tokens per sample
    diffusion_steps: tuple[int, ...] = (8, 16, 32, 64)
    temperatures: tuple[float, ...] = (0.7, 0.85, 1.0)
    nelbo_samples: int = 4  # MDM noise draws per validation row
    max_val_rows: int = 0  # 0 = the whole validation split
    chain_rule_rows: int = 4
    prompts: int = 4  # side-by-side prompts
    prompt_tokens: int = 16
    judge: str = "smollm2"
    mauve: bool = True


COMPARE_PRESETS = {
    "smoke": CompareSettings(
        samples=8,
        gen_length=24,
        diffusion_steps=(4, 24),
        temperatures=(0.8, 1.0),
        nelbo_samples=2,
        max_val_rows=64,
        chain_rule_rows=2,
        prompts=2,
        prompt_tokens=8,
    ),
    "demo": CompareSettings(
        samples=32,
        gen_length=64,
        diffusion_steps=(8, 16, 32, 64),
        temperatures=(0.7, 0.85, 1.0),
        nelbo_samples=4,
        chain_rule_rows=4,
        prompts=4,
        prompt_tokens=16,
    ),
    "small": CompareSettings(
        samples=256,
        gen_length=512,
        diffusion_steps=(64, 128, 256, 512),
        nelbo_samples=8,
        max_val_rows=2000,
        chain_rule_rows=8,
    ),
}


def settings_for(preset: str) -> CompareSettings:
    """The evaluation settings of a training preset: its own, the GPU ones for the *-small
    presets, and the demo's otherwise."""
    if preset in COMPARE_PRESETS:
        return COMPARE_PRESETS[preset]
    return COMPARE_PRESETS["small" if preset.endswith("small") else "demo"]


# ---------------------------------------------------------------- resumable stages


class Stages:
    """Stage results stored as JSON, keyed by a hash of the inputs that produced them."""

    def __init__(self, root: Path, force: bool):
        self.root, self.force = root / "stages", force
        self.root.mkdir(parents=True, exist_ok=True)
        self.reused: list[str] = []

    def run(self, name: str, inputs: dict[str, Any], compute) -> dict[str, Any]:
        key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
        path = self.root / f"{name}.json"
        if path.exists() and not self.force:
            stored = json.loads(path.read_text())
            if stored.get("key") == key:
                print(f"[{name}] reusing the stored result (--force recomputes)")
                self.reused.append(name)
                return stored["result"]
        start = time.perf_counter()
        result = compute()
        elapsed = time.perf_counter() - start
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"key": key, "seconds": elapsed, "result": result}, indent=2, default=float)
        )
        tmp.replace(path)
        print(f"[{name}] done in {elapsed:.1f} s")
        return result


def train_or_reuse(
    label: str, run_dir: Path, start_argv: list[str], extra: list[str], force: bool
) -> dict[str, Any]:
    """Train one run: reuse it if it finished, resume it if it has checkpoints, else start it
    with ``start_argv`` (the objective, preset and output flags) plus ``extra``."""
    import train

    final = run_dir / "final.json"
    if final.exists() and not force:
        summary = json.loads(final.read_text())
        if summary.get("finished"):
            print(f"[train {label}] reusing the finished run in {run_dir}")
            summary["reused"] = True
            return summary
    if force and run_dir.exists():
        shutil.rmtree(run_dir)
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
        return train.train(["--resume", str(run_dir), *extra])
    return train.train([*start_argv, *extra])


def train_both(
    preset: str, out: Path, extra: list[str], budget: str, force: bool
) -> dict[str, dict[str, Any]]:
    summaries = {}
    flops_budget: list[str] = []
    for objective in OBJECTIVES:
        run_dir = out / objective
        start = ["--objective", objective, "--preset", preset, "--out", str(run_dir)]
        summaries[objective] = train_or_reuse(
            objective, run_dir, start, [*extra, *flops_budget], force
        )
        if budget == "flops" and objective == "ar":
            # The MDM gets the AR's FLOPs, not its tokens (equal here up to the [MASK] row).
            spent = summaries["ar"]["tokens_seen"] * summaries["ar"]["flops_per_token"]
            flops_budget = ["--max-flops", repr(spent)]
    return summaries


# ---------------------------------------------------------------- evaluation stages


def load(out: Path, objective: str, device: str = "cpu"):
    from shared.checkpoint import load_model_from_checkpoint

    return load_model_from_checkpoint(out / objective, device)


def likelihood_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    from eval.likelihood import evaluate_checkpoint

    results = {}
    for objective in OBJECTIVES:
        results[objective] = evaluate_checkpoint(
            str(out / objective),
            samples=settings.nelbo_samples,
            chain_rule_rows=settings.chain_rule_rows if objective == "mdm" else 0,
            max_rows=settings.max_val_rows,
            batch_size=32,
        )
    return results


def forward_flops_per_token(config: dict[str, Any], context: int) -> float:
    """Inference FLOPs per token position: a third of the training count (forward only)."""
    from shared.config import ModelConfig
    from shared.model import flops_per_token

    return flops_per_token(ModelConfig.from_dict(config), context) / 3.0


def generation_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Unconditional samples for every setting; texts, ids, NFE, time and FLOPs per token."""
    sets: dict[str, dict[str, Any]] = {}
    length = settings.gen_length

    ar_model, tokenizer, ar_state = load(out, "ar")
    engine = ARGenerator(ar_model, tokenizer)
    ar_flops = forward_flops_per_token(ar_state["model_config"], 1 + length)
    for temperature in tqdm(settings.temperatures, desc="AR decoding", leave=False):
        config = GenerationConfig(
            max_new_tokens=length,
            stop_on_eos=False,
            sampling=SamplingConfig(temperature=temperature),
        )
        start = time.perf_counter()
        result = engine.generate([[tokenizer.eos_id]] * settings.samples, config, seed=0)
        elapsed = time.perf_counter() - start
        sets[f"ar T={temperature:g}"] = {
            "objective": "ar",
            "sampler": "kv-cached ancestral",
            "temperature": temperature,
            "steps": length,
            "nfe": result.forward_passes,
            "seconds": elapsed,
            "texts": result.texts,
            "ids": result.tokens,
            "flops_per_token": ar_flops,
            "approximate": False,
        }

    mdm = DiffusionGenerator(*load(out, "mdm"))
    canvas = mdm.prompt_canvas([[]] * settings.samples, length)
    mdm_flops = forward_flops_per_token(mdm.state["model_config"], 1 + length)
    configs: list[tuple[str, SamplerConfig, float]] = []
    for steps in settings.diffusion_steps:
        configs.append((f"mdm ancestral {steps} steps", SamplerConfig(Ancestral(steps)), 1.0))
        configs.append(
            (
                f"mdm fixed low-conf {steps} steps",
                SamplerConfig(FixedCount(steps, "low_confidence")),
                1.0,
            )
        )
    configs.append(("mdm threshold 0.9", SamplerConfig(Threshold(0.9)), 1.0))
    middle = settings.diffusion_steps[len(settings.diffusion_steps) // 2]
    for temperature in settings.temperatures:
        if temperature != 1.0:
            configs.append(
                (
                    f"mdm ancestral {middle} steps T={temperature:g}",
                    SamplerConfig(
                        Ancestral(middle), sampling=SamplingConfig(temperature=temperature)
                    ),
                    temperature,
                )
            )
    for name, config, temperature in tqdm(configs, desc="diffusion samplers", leave=False):
        start = time.perf_counter()
        result = mdm.fill(canvas, config, seed=0, eos="stop")
        elapsed = time.perf_counter() - start
        sets[name] = {
            "objective": "mdm",
            "sampler": config.strategy.name,
            "temperature": temperature,
            "steps": getattr(config.strategy, "steps", None),
            "nfe": result.nfe,
            "seconds": elapsed,
            "texts": result.texts,
            "ids": result.tokens,
            # Every evaluation processes the whole canvas; spread over the generated tokens.
            "flops_per_token": result.nfe * canvas.length * mdm_flops / length,
            "approximate": result.approximate,
        }
    for entry in sets.values():
        entry["tokens_per_s"] = settings.samples * length / entry["seconds"]
        entry["nfe_per_token"] = entry["nfe"] / length
    return sets


def validation_rows(state: dict[str, Any], tokenizer):
    """The validation rows of a run, under the run's own corpus, tokenizer and protocol."""
    from shared.data import load_corpus, tokenize_corpus

    config = state["train_config"]
    corpus = load_corpus(
        config["dataset"],
        text_field=config["text_field"],
        val_dataset=config["val_dataset"] or None,
    )
    return tokenize_corpus(
        corpus,
        tokenizer,
        protocol=config["protocol"],
        seq_len=config["seq_len"],
        cache_dir=Path(config["cache_dir"]),
    )["validation"].tokens


def reference_texts(out: Path, count: int, length: int) -> list[str]:
    """Held-out text cut to the samples' length in tokens, for MAUVE."""
    _, tokenizer, state = load(out, "ar")
    rows = validation_rows(state, tokenizer)
    return [tokenizer.decode(row[1 : 1 + length]) for row in rows[:count]]


def quality_stage(out: Path, sets: dict[str, Any], settings: CompareSettings) -> dict[str, Any]:
    from eval.quality import diversity_report, load_judge, mauve_score

    judge = load_judge(settings.judge)
    references = reference_texts(out, max(settings.samples, 2), settings.gen_length)
    scores: dict[str, Any] = {"judge": judge.identity, "sets": {}}
    reference_score = judge.score(references)
    scores["reference"] = {
        "judge_ppl": reference_score.perplexity,
        **diversity_report(references, [[0]] * len(references)),
    }
    for name, entry in tqdm(sets.items(), desc="judging samples", leave=False):
        texts = [t if t.strip() else " " for t in entry["texts"]]
        judged = judge.score(texts)
        row = {"judge_ppl": judged.perplexity, **diversity_report(texts, entry["ids"])}
        main_set = name in ("ar T=1", f"mdm ancestral {settings.diffusion_steps[-1]} steps")
        if settings.mauve and main_set:
            row["mauve"] = mauve_score(texts, references)
        scores["sets"][name] = row
    return scores


def examples_stage(out: Path, settings: CompareSettings) -> dict[str, Any]:
    """Side-by-side continuations of the same prompts, and one infilling example."""
    ar_model, tokenizer, state = load(out, "ar")
    mdm = DiffusionGenerator(*load(out, "mdm"))
    rows = validation_rows(state, tokenizer)
    k, length = settings.prompt_tokens, settings.gen_length
    step = max(1, len(rows) // max(settings.prompts, 1))
    prompts = [rows[i * step][1 : 1 + k].tolist() for i in range(settings.prompts)]
    engine = ARGenerator(ar_model, tokenizer)
    start = time.perf_counter()
    ar = engine.generate(
        [[tokenizer.eos_id, *p] for p in prompts],
        GenerationConfig(
            max_new_tokens=length, stop_on_eos=False, sampling=SamplingConfig(temperature=0.8)
        ),
        seed=0,
    )
    ar_seconds = time.perf_counter() - start
    steps = settings.diffusion_steps[-1]
    sampler = SamplerConfig(Ancestral(steps), sampling=SamplingConfig(temperature=0.8))
    start = time.perf_counter()
    continued = mdm.generate(prompts, length, sampler, seed=0, eos="stop")
    mdm_seconds = time.perf_counter() - start
    side_by_side = [
        {"prompt": tokenizer.decode(p), "ar": ar.texts[i], "mdm": continued.texts[i]}
        for i, p in enumerate(prompts)
    ]
    # Infilling: keep a prefix and a suffix of a held-out row, mask the middle.
    row = rows[min(len(rows) - 1, step // 2)]
    middle = min(length, max(4, (len(row) - 1) // 2))
    prefix, suffix = row[1 : 1 + k].tolist(), row[1 + k + middle : 1 + 2 * k + middle].tolist()
    fixed = {1 + i: t for i, t in enumerate(prefix)}
    fixed |= {1 + k + middle + j: t for j, t in enumerate(suffix)}
    infill = mdm.infill_canvas(1 + 2 * k + middle if suffix else 1 + k + middle, fixed)
    filled = mdm.fill(infill, sampler, seed=0, eos="none").raw
    ar_prefix_only = engine.generate(
        [[tokenizer.eos_id, *prefix]],
        GenerationConfig(
            max_new_tokens=middle, stop_on_eos=False, sampling=SamplingConfig(temperature=0.8)
        ),
        seed=0,
    )
    return {
        "side_by_side": side_by_side,
        "ar_seconds_per_sample": ar_seconds / len(prompts),
        "mdm_seconds_per_sample": mdm_seconds / len(prompts),
        "ar_nfe": ar.forward_passes,
        "mdm_nfe": continued.nfe,
        "mdm_steps": steps,
        "infill": {
            "prefix": tokenizer.decode(prefix),
            "suffix": tokenizer.decode(suffix),
            "original_middle": tokenizer.decode(row[1 + k : 1 + k + middle].tolist()),
            "mdm_middle": tokenizer.decode(filled.tokens[0, 1 + k : 1 + k + middle].tolist()),
            "ar_prefix_only": ar_prefix_only.texts[0],
        },
    }


# ---------------------------------------------------------------- the report


def write_report(
    out: Path,
    preset: str,
    summaries: dict[str, Any],
    likelihood: dict[str, Any],
    sets: dict[str, Any],
    quality: dict[str, Any],
    examples: dict[str, Any],
    settings: CompareSettings,
    wall_seconds: float,
    reused: list[str],
) -> dict[str, Path]:
    from eval.report import Report, Table, frontier_figure

    report = Report(
        f"AR vs masked diffusion: preset `{preset}`",
        out,
        config={
            "preset": preset,
            "settings": dataclasses.asdict(settings),
            "training": {k: v["data"] | {"steps": v["step"]} for k, v in summaries.items()},
        },
        seeds={"train": summaries["ar"]["data"].get("seed", 0), "sampling": 0},
    )
    ar_l = likelihood["ar"]["estimates"]["nll"]
    mdm_l = likelihood["mdm"]["estimates"]["nelbo"]
    ratio = math.exp(mdm_l["nats_per_token"] - ar_l["nats_per_token"])
    exact_bytes = likelihood["ar"]["protocol"]["tokenizer"].get("bytes_exact", True)
    byte_note = "" if exact_bytes else " (approximate: the tokenizer normalizes text)"
    ar_best = quality["sets"]["ar T=1"]["judge_ppl"]
    report.text(
        f"**Likelihood.** On the same {ar_l['tokens']:,} validation tokens the AR model scores "
        f"{ar_l['bits_per_byte']:.4f} bits/byte{byte_note} (exact NLL) and the MDM at most "
        f"{mdm_l['bits_per_byte']:.4f} (NELBO, 95% interval of the per-token value "
        f"[{mdm_l['nats_per_token_ci95'][0]:.4f}, {mdm_l['nats_per_token_ci95'][1]:.4f}] nats): "
        f"an MDM/AR perplexity ratio of at most **{ratio:.2f}** after "
        f"{summaries['ar']['tokens_seen']:,} training tokens each (published: about 1.2-1.3 at "
        "large compute, larger at small compute).\n\n"
        f"**Samples.** The judge ({quality['judge']}) gives AR samples at temperature 1 a "
        f"perplexity of {ar_best:.1f}; held-out text scores "
        f"{quality['reference']['judge_ppl']:.1f}. The frontier below shows what each diffusion "
        "sampler buys per network evaluation. Wall time of this invocation: "
        f"{wall_seconds / 60:.1f} min"
        + (
            f" (reused from an earlier run: {', '.join(reused)})."
            if reused
            else ", every stage computed."
        )
    )
    rows = {
        "AR": ar_l | {"protocol": likelihood["ar"]["protocol"]},
        "MDM": mdm_l | {"protocol": likelihood["mdm"]["protocol"]},
    }
    if "chain_rule_nll" in likelihood["mdm"]["estimates"]:
        chain = likelihood["mdm"]["estimates"]["chain_rule_nll"]
        rows[f"MDM left-to-right (first {settings.chain_rule_rows} rows)"] = chain | {
            "protocol": likelihood["mdm"]["protocol"]
        }
        rows[f"MDM NELBO (same {settings.chain_rule_rows} rows)"] = likelihood["mdm"]["estimates"][
            "nelbo_on_chain_rule_rows"
        ] | {"protocol": likelihood["mdm"]["protocol"]}
    report.likelihood_table("Validation likelihood (same rows, same protocol)", rows)
    # One peak for both rows: the start-up matmul measurement is noisy on a shared machine.
    peak = max(s["peak_flops"] for s in summaries.values())
    report.table(
        Table(
            "Training",
            ["model", "parameters", "tokens seen", "train tokens/s", "MFU", "precision"],
            [
                [
                    k.upper(),
                    s["parameters"],
                    s["tokens_seen"],
                    s["train_tokens_per_s"],
                    (s["train_tokens_per_s"] or 0) * s["flops_per_token"] / peak,
                    s["precision"],
                ]
                for k, s in summaries.items()
            ],
            note=f"MFU against one peak of {peak / 1e12:.3g} TFLOP/s for both rows "
            f"({summaries['ar']['peak_flops_source']}); FLOPs by the config count "
            "(6N + attention), the same formula for both objectives.",
        )
    )
    quality_rows = []
    for name, entry in sets.items():
        q = quality["sets"][name]
        quality_rows.append(
            [
                name,
                entry["nfe"],
                entry["nfe_per_token"],
                entry["flops_per_token"],
                entry["tokens_per_s"],
                entry["seconds"] / settings.samples,
                q["judge_ppl"],
                q["unigram_entropy"],
                q["distinct_2"],
                q["repetition_rate_4gram"],
                q.get("mauve", "-"),
            ]
        )
    quality_rows.append(
        [
            "held-out text",
            "-",
            "-",
            "-",
            "-",
            "-",
            quality["reference"]["judge_ppl"],
            "-",
            quality["reference"]["distinct_2"],
            quality["reference"]["repetition_rate_4gram"],
            "-",
        ]
    )
    report.table(
        Table(
            f"Generation: {settings.samples} unconditional samples x {settings.gen_length} tokens",
            [
                "setting",
                "NFE",
                "NFE/token",
                "FLOPs/token",
                "tokens/s",
                "s/sample",
                "judge ppl",
                "unigram entropy",
                "distinct-2",
                "4-gram repetition",
                "MAUVE",
            ],
            quality_rows,
            note=f"Judge: {quality['judge']}. Entropy is per sample over model token ids; MAUVE "
            "against held-out text of the same length (few samples: a noisy number).",
        )
    )
    nfe_curves: dict[str, list[tuple[float, float]]] = {}
    entropy_curves: dict[str, list[tuple[float, float]]] = {}
    for name, entry in sets.items():
        q = quality["sets"][name]
        if entry["temperature"] == 1.0:
            label = "AR (KV cache)" if entry["objective"] == "ar" else f"MDM {entry['sampler']}"
            nfe_curves.setdefault(label, []).append((entry["nfe"], q["judge_ppl"]))
        if (
            entry["objective"] == "ar"
            or entry["sampler"] == "ancestral"
            and (entry["steps"] == settings.diffusion_steps[len(settings.diffusion_steps) // 2])
        ):
            label = "AR" if entry["objective"] == "ar" else "MDM ancestral"
            entropy_curves.setdefault(label, []).append((q["unigram_entropy"], q["judge_ppl"]))
    report.plot(
        "frontier_nfe",
        frontier_figure(
            nfe_curves,
            xlabel="network evaluations per batch (NFE)",
            ylabel="judge perplexity",
            title="Quality vs inference compute",
            logx=True,
        ),
        "Judge perplexity vs NFE",
    )
    report.plot(
        "frontier_entropy",
        frontier_figure(
            entropy_curves,
            xlabel="unigram entropy (nats)",
            ylabel="judge perplexity",
            title="Quality vs diversity (temperature sweep)",
        ),
        "Judge perplexity vs entropy under a temperature sweep",
    )
    lines = ["### Same prompts, both models", ""]
    for item in examples["side_by_side"]:
        lines += [
            f"- **prompt**: {item['prompt']!r}",
            f"  - **AR**: {item['ar']!r}",
            f"  - **MDM**: {item['mdm']!r}",
        ]
    infill = examples["infill"]
    lines += [
        "",
        f"AR: {examples['ar_seconds_per_sample']:.2f} s/sample ({examples['ar_nfe']} forwards "
        f"per batch); MDM ancestral {examples['mdm_steps']} steps: "
        f"{examples['mdm_seconds_per_sample']:.2f} s/sample ({examples['mdm_nfe']} NFE).",
        "",
        "### Infilling (only the MDM can condition on a suffix)",
        "",
        f"- prefix: {infill['prefix']!r}",
        f"- suffix: {infill['suffix']!r}",
        f"- original middle: {infill['original_middle']!r}",
        f"- **MDM middle** (sees prefix and suffix): {infill['mdm_middle']!r}",
        f"- AR continuation (prefix only): {infill['ar_prefix_only']!r}",
    ]
    report.text("\n".join(lines))
    report.results.update(
        {
            "likelihood_raw": likelihood,
            "generation": {
                k: {key: v for key, v in e.items() if key not in ("ids",)} for k, e in sets.items()
            },
            "quality": quality,
            "examples": examples,
            "training": summaries,
            "mdm_ar_perplexity_ratio": ratio,
            "wall_seconds": wall_seconds,
        }
    )
    return report.write()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--out", default=None, help="output directory (default runs/<preset>)")
    parser.add_argument("--force", action="store_true", help="redo every stage")
    parser.add_argument(
        "--budget",
        choices=["tokens", "flops"],
        default="tokens",
        help="what the two models are matched on",
    )
    parser.add_argument("--no-mauve", action="store_true", help="skip MAUVE")
    parser.add_argument("--judge", default=None, help="judge model (default: smollm2 wheel)")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out or f"runs/{args.preset}")
    if args.preset.startswith("synthetic"):
        from eval.synthetic_compare import SYNTHETIC_PRESETS, run

        if args.preset not in SYNTHETIC_PRESETS:
            print(
                f"error: preset={args.preset!r} is unknown; synthetic presets: "
                f"{sorted(SYNTHETIC_PRESETS)}",
                file=sys.stderr,
            )
            return 2
        paths = run(args.preset, out, extra, args.force)
        print(f"report: {paths['markdown']}")
        return 0
    settings = settings_for(args.preset)
    if args.no_mauve or args.judge:
        settings = dataclasses.replace(
            settings, mauve=settings.mauve and not args.no_mauve, judge=args.judge or settings.judge
        )
    from shared.config import USER_ERRORS

    started = time.perf_counter()
    try:
        summaries = train_both(args.preset, out, extra, args.budget, args.force)
        stages = Stages(out, args.force)
        key = {
            "train": {k: (v["step"], v.get("val_nats_per_token")) for k, v in summaries.items()},
            "settings": dataclasses.asdict(settings),
        }
        likelihood = stages.run("likelihood", key, lambda: likelihood_stage(out, settings))
        sets = stages.run("generate", key, lambda: generation_stage(out, settings))
        quality = stages.run("quality", key, lambda: quality_stage(out, sets, settings))
        examples = stages.run("examples", key, lambda: examples_stage(out, settings))
        paths = write_report(
            out,
            args.preset,
            summaries,
            likelihood,
            sets,
            quality,
            examples,
            settings,
            time.perf_counter() - started,
            [f"train {k}" for k, v in summaries.items() if v.get("reused")] + stages.reused,
        )
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ar, mdm = likelihood["ar"]["estimates"]["nll"], likelihood["mdm"]["estimates"]["nelbo"]
    print(f"AR  {ar['nats_per_token']:.4f} nats/token, {ar['bits_per_byte']:.4f} bits/byte")
    print(
        f"MDM {mdm['nats_per_token']:.4f} nats/token (NELBO), {mdm['bits_per_byte']:.4f} bits/byte"
    )
    print(f"report: {paths['markdown']} ({(time.perf_counter() - started) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
