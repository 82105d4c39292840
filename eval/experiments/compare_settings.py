"""What the comparison's evaluation stages do, per preset: sample counts and lengths, diffusion
step counts, temperatures, Monte-Carlo draws, the judge."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shared.errors import ConfigError


@dataclass(frozen=True)
class CompareSettings:
    """What the evaluation stages do; presets pick values that fit their time budget."""

    samples: int = 32  # unconditional samples per generation setting
    # samples of the two headline settings (AR at T=1, MDM ancestral at the most steps): enough
    # for a judge-perplexity interval of about +-10% at the demo's scale
    headline_samples: int = 160
    gen_length: int = 64  # generated tokens per sample
    diffusion_steps: tuple[int, ...] = (8, 16, 32, 64)
    temperatures: tuple[float, ...] = (0.7, 0.85, 1.0)
    nelbo_samples: int = 4  # MDM noise draws per validation row
    max_val_rows: int = 0  # 0 = the whole validation split
    chain_rule_rows: int = 4
    prompts: int = 4  # side-by-side prompts
    prompt_tokens: int = 16
    judge: str = "smollm2"
    curve_points: int = 8  # validations spaced evenly in log-FLOPs per run (the learning curves)
    lr_factors: tuple[float, ...] = (1 / 3, 1.0, 3.0)  # --tune-lr: x the preset's learning rate
    tune_fraction: float = 0.25  # --tune-lr: each sweep run gets this fraction of the budget
    mauve: bool = True
    # The budget points (eval.experiments.compare_budgets): every seed trains each objective at
    # these fractions of the main budget (and at the main budget), as cooldown branches of one
    # warmup-stable-decay run; the headline multiplier is read by ``headline_rule``
    # (eval.budgets.HEADLINE_RULES) from the points more than ``plateau_margin`` nats below the
    # unigram entropy.
    seeds: tuple[int, ...] = (0,)
    ar_budgets: tuple[float, ...] = (1 / 8, 1 / 4, 1 / 2)
    mdm_budgets: tuple[float, ...] = (1 / 8, 1 / 4, 1 / 2)
    cooldown_fraction: float = 0.2
    headline_rule: str = "mdm_largest"
    plateau_margin: float = 0.1
    # each objective's own warmup (0: the preset's), like its own tuned learning rate
    ar_warmup_steps: int = 0
    mdm_warmup_steps: int = 0
    # the families trained and compared (--objectives): AR first, then the diffusion families,
    # each measured against it; every diffusion family trains at the MDM's budgets and warmup
    objectives: tuple[str, ...] = ("ar", "mdm")
    bd_block_size: int = 16  # block diffusion's block size (it must divide seq_len)
    # the speed-quality frontier: every sampler setting timed at these batch sizes, after
    # frontier_warmup untimed rounds, over frontier_rounds alternating rounds
    # (eval.speed.throughput), split between three fresh processes, each process's ratios to
    # the AR kept (compare_speed.throughput_stage)
    frontier_batches: tuple[int, ...] = (1, 32)
    frontier_rounds: int = 5
    frontier_warmup: int = 1


COMPARE_PRESETS = {
    "smoke": CompareSettings(
        samples=8,
        headline_samples=8,
        gen_length=24,
        diffusion_steps=(4, 24),
        temperatures=(0.8, 1.0),
        nelbo_samples=2,
        max_val_rows=64,
        chain_rule_rows=2,
        prompts=2,
        prompt_tokens=8,
        ar_budgets=(1 / 4, 1 / 2),
        mdm_budgets=(1 / 4, 1 / 2),
        frontier_batches=(1, 4),
        frontier_rounds=2,
    ),
    # One seed fits the demo's 15 minutes on a 2-core CPU; --seeds 0,1,2 gives intervals over
    # seeds (docs/studies/demo-budgets.md). The budgets (of the 320-step main budget): AR 12, 18,
    # 27, 40, 80, 160 steps, with a 10-step warmup so its smallest budgets reach the MDM's loss
    # range; MDM 120, 160, 200, 250 steps with the preset's 30-step warmup, which it needs to
    # leave the unigram plateau (with 10 it stayed there past step 250).
    "demo": CompareSettings(
        samples=32,
        gen_length=64,
        diffusion_steps=(8, 16, 32, 64),
        temperatures=(0.7, 0.85, 1.0),
        nelbo_samples=4,
        chain_rule_rows=4,
        prompts=4,
        prompt_tokens=16,
        seeds=(0,),
        ar_budgets=(12 / 320, 18 / 320, 27 / 320, 40 / 320, 80 / 320, 160 / 320),
        mdm_budgets=(120 / 320, 160 / 320, 200 / 320, 250 / 320),
        ar_warmup_steps=10,
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


# What --objectives may name: AR and the diffusion families the samplers here support.
COMPARABLE = ("ar", "mdm", "bd", "udm", "eso")


def diffusion_families(settings: CompareSettings) -> tuple[str, ...]:
    """The diffusion families of the comparison, each measured against the AR model."""
    return tuple(name for name in settings.objectives if name != "ar")


def budget_fractions(settings: CompareSettings, objective: str) -> tuple[float, ...]:
    return settings.ar_budgets if objective == "ar" else settings.mdm_budgets


def own_warmup(settings: CompareSettings, objective: str) -> int:
    """The objective's own warmup steps (0: the preset's)."""
    return settings.ar_warmup_steps if objective == "ar" else settings.mdm_warmup_steps


def objectives_asked(text: str) -> tuple[str, ...]:
    """The families ``--objectives ar,mdm,udm`` names, AR first; refuses unknown or repeated
    names, a list without AR (M(L) is each diffusion family against it) or without a diffusion
    family."""
    names = [part.strip() for part in text.split(",")]
    unknown = [name for name in names if name not in COMPARABLE]
    if unknown:
        raise ConfigError(
            f"--objectives {text!r}: unknown objective {unknown[0]!r}; choose from "
            + ", ".join(COMPARABLE)
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--objectives {text!r} names {', '.join(repeated)} more than once")
    if "ar" not in names:
        raise ConfigError(
            f"--objectives {text!r} has no ar: the compute multiplier M(L) measures each "
            "diffusion family against the AR model; add ar (--objectives ar," + text + ")"
        )
    if len(names) == 1:
        raise ConfigError(
            f"--objectives {text!r} names no diffusion family to compare with AR: add mdm, bd, "
            "udm or eso"
        )
    return ("ar", *(name for name in names if name != "ar"))


def headline_sets(settings: CompareSettings) -> tuple[str, ...]:
    """The sample sets the report's headline quality numbers come from: AR at T=1, then each
    diffusion family's ancestral sampler at the most steps."""
    steps = settings.diffusion_steps[-1]
    return ("ar T=1", *(f"{name} ancestral {steps} steps" for name in diffusion_families(settings)))


def settings_for(preset: str, max_seq_len: int | None = None) -> CompareSettings:
    """The evaluation settings of a training preset: its own, the GPU ones for the *-small
    presets, and the demo's otherwise; with ``max_seq_len``, lengths shrink to fit the model
    (BOS, a prompt and the generated tokens in its context)."""
    if preset in COMPARE_PRESETS:
        settings = COMPARE_PRESETS[preset]
    else:
        settings = COMPARE_PRESETS["small" if preset.endswith("small") else "demo"]
    return settings if max_seq_len is None else fit_to_context(settings, max_seq_len)


def fit_to_context(settings: CompareSettings, max_seq_len: int) -> CompareSettings:
    """``settings`` with the prompt and generation lengths (and step counts, which cannot exceed
    the tokens generated) cut so that BOS + prompt + generation fit ``max_seq_len``."""
    prompt = min(settings.prompt_tokens, max(1, max_seq_len // 4))
    length = min(settings.gen_length, max_seq_len - 1 - prompt)
    steps = steps_within(settings.diffusion_steps, length)
    return replace(settings, prompt_tokens=prompt, gen_length=length, diffusion_steps=steps)


def steps_within(steps: tuple[int, ...], length: int) -> tuple[int, ...]:
    """The diffusion step counts cut to at most ``length`` (a step reveals at least one of the
    tokens generated), each once, in order."""
    return tuple(sorted({min(s, length) for s in steps}))


# ---------------------------------------------------------------- evaluation stages
