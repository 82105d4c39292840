"""What the exact frontier measures, fixed before any run: the languages, the training scales,
the sampler settings with their NFE per token, and the rule that writes the headline.

Both languages are hidden Markov models small enough that every sampler's output distribution
is enumerable with a *trained* network too (3 symbols, at most 4 of them), sharing one tokenizer
of the alphabet, EOS and PAD (``symbol_tokenizer``): a trained uniform-state model's support has
N = 4 ids and its chain N^G = 4^5 rows; the byte tokenizer's 257 would make it 257^5.

- "fixed" (the headline language): every string has exactly 4 symbols and every one of the 81
  has p > 0, so every canvas a sampler reaches with the exact denoiser is possible and each
  family's exact denoiser is unique. Its document and EOS fill a row exactly, so packed rows
  (the uniform-state family's) start at a document boundary, as its oracle assumes.
- "variable" (strings of 1-4 symbols, EOS and PAD inside the generated positions): a
  k-per-step masked sampler reaches canvases no row can produce, where the exact denoiser is
  not defined; the report gives that mass and the sampler's error under two completions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from arlm.generation_types import GenerationConfig
from dllm.eso.sampler import EsoSamplerConfig
from dllm.remdm import RELEASED_LOOP_TIMES, Remdm
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral, EntropyBounded, FixedCount, Threshold
from dllm.uniform.sampler import UniformSamplerConfig
from eval.budgets import seed_spread
from shared import door
from shared.data.rows import pack_rows
from shared.data.synthetic.hmm import HMMLanguage
from shared.errors import ConfigError
from shared.tokenizer import EOS_TOKEN, PAD_TOKEN

LANGUAGES = {
    "fixed": dict(
        states=3, vocab=3, max_len=4, stop_min=0.0, stop_max=0.0, concentration=1.0, seed=0
    ),
    "variable": dict(states=3, vocab=3, max_len=4, stop_min=0.2, stop_max=0.5, seed=0),
}
HEADLINE_LANGUAGE = "fixed"
MAX_LEN = 4  # of both languages: one canvas, one row length, one set of settings
GEN_LENGTH = MAX_LEN + 1  # the longest string and its EOS
SEQ_LEN = MAX_LEN + 2  # BOS + longest string + EOS
BLOCK_SIZE = 2  # bd: blocks [BOS, x1], [x2, x3], [x4, x5]
FAMILIES = ("ar", "mdm", "bd", "udm", "eso")
# Decided before the run: TV is finite for every family (KL(q||p) is infinite for any sampler
# that puts mass on an invalid string: the uniform-state one at finite steps, every trained net)
HEADLINE_METRIC = "tv"
HEADLINE_NFE = 0.6  # model calls per generated token: 3 calls for the 5 positions
POSITIVE_CONTROL_TOLERANCE = 1e-9
# a trained net gives every id some mass: draws of probability <= this are pruned (and reported)
MIN_PROB = 1e-6


@dataclass(frozen=True)
class Scale:
    seeds: tuple[int, ...]
    max_steps: int
    batch_size: int
    corpus: int  # training strings
    speed_batch: int
    speed_rounds: int
    nelbo_samples: int
    every_setting: bool  # False: the positive controls and one setting per family at the budget


SCALES = {
    "smoke": Scale((0,), 30, 16, 1000, 8, 2, 2, every_setting=False),
    "cpu": Scale((0, 1, 2), 600, 64, 8000, 64, 5, 16, every_setting=True),
}


def check_scale(name: str) -> Scale:
    if name not in SCALES:
        raise ConfigError(f"scale={name!r} is unknown; valid: {sorted(SCALES)}")
    return SCALES[name]


def language_spec(name: str, corpus: int) -> str:
    query = "&".join(f"{k}={v}" for k, v in LANGUAGES[name].items())
    return f"synthetic:hmm?{query}&n={corpus}&n_val={max(200, corpus // 10)}"


def language(name: str) -> HMMLanguage:
    return HMMLanguage(**LANGUAGES[name])


def has_full_support(lang: HMMLanguage) -> bool:
    """Every string of exactly max_len symbols has p > 0 and no other string has any: then no
    canvas of symbols is impossible, and no EOS or PAD stands among the string's positions."""
    strings = dict(lang.enumerate())
    every = len(lang.alphabet) ** lang.max_len
    return len(strings) == every and all(
        len(s) == lang.max_len and math.isfinite(log_p) for s, log_p in strings.items()
    )


def check_headline_language(name: str) -> str:
    """Refuse, in one line, a headline language whose exact denoiser is not unique."""
    if name not in LANGUAGES:
        raise ConfigError(
            f"--headline-language={name!r} is unknown; valid: {HEADLINE_LANGUAGE!r} (the "
            "full-support language)"
        )
    if not has_full_support(language(name)):
        raise ConfigError(
            f"--headline-language={name!r} is refused: its sampler reaches canvases no row can "
            f"produce, where the exact denoiser is not unique; use {HEADLINE_LANGUAGE!r}, the "
            f"full-support language (every string of {MAX_LEN} symbols has p > 0)"
        )
    return name


def symbol_tokenizer(out: Path, alphabet: str) -> str:
    """Write a tokenizer.json of one id per symbol plus EOS and PAD; its ``hf:`` spec."""
    backend = BackendTokenizer(models.BPE(vocab={s: i for i, s in enumerate(alphabet)}, merges=[]))
    backend.add_special_tokens([EOS_TOKEN, PAD_TOKEN])
    door.make_folders(out)
    path = out / "symbols-tokenizer.json"
    text = backend.to_str()
    if not path.exists() or door.read_json_file(path, root=out) != json.loads(text):
        door.write_atomic(path, text, root=out)
    return f"hf:{path.resolve()}"


def boundary_share(lang: HMMLanguage, corpus: int) -> float:
    """The share of packed training rows (``shared.data.rows.pack_rows``) of ``corpus`` strings
    of ``lang`` that start at a document boundary (1.0: the packed rows are the documents)."""
    docs = [
        np.array([lang.symbol_index(c) for c in s], dtype=np.int32)
        for s in lang.sample(corpus, seed=0)
    ]
    eos = len(lang.alphabet)
    rows = pack_rows(docs, seq_len=SEQ_LEN, eos_id=eos, pad_id=eos + 1, keep_partial=False)
    # the token before each row's chunk is the previous row's last one (the first row: a start)
    before = np.concatenate([[eos], rows[:-1, -1]])
    return float(np.mean(before == eos))


def oracles(lang: HMMLanguage, family: str) -> dict[str, dict[str, str]]:
    """The exact denoisers (name -> ``exact_denoiser`` options) a family's sampler runs with.
    On a full-support language one, "exact" (packed rows start at a document boundary there,
    as the uniform one assumes). Otherwise AR's is still unique; the absorbing ones differ on
    impossible canvases: both completions; the uniform family trains on packed rows cut at
    fixed offsets: first the oracle of those rows, then the boundary one its samples need."""
    if family == "ar" or has_full_support(lang):
        return {"exact": {}}
    if family == "udm":
        return {"packed": {"row_start": "packed"}, "boundary": {"row_start": "boundary"}}
    return {"uniform": {"completion": "uniform"}, "prefix": {"completion": "prefix"}}


# the ReMDM loop's and the Psi loop's times (ReMDM's released loop settings); their eta at the
# loop's bound, (1 - alpha_on) / alpha_on for ReMDM and 1 - alpha_on for Psi, so that the
# corrector steps do as much as they may on a 5-position canvas
LOOP_TIMES = RELEASED_LOOP_TIMES
CORRECTOR_ETA = 0.1
CORRECTED_STEPS = (3, 5, 10)  # the plain samplers and their correctors, step for step
# the plain sampler each corrector is judged against, at the same steps (the same NFE)
CORRECTOR_BASES = {
    ("mdm", "remdm-cap"): "ancestral",
    ("mdm", "remdm-loop"): "ancestral",
    ("udm", "psi-cap"): "ancestral",
    ("udm", "psi-loop"): "ancestral",
}
ESO_TRAINED_ALPHA_0 = 0.5  # the objective's default


@dataclass(frozen=True)
class SamplerSetting:
    """One sampler of one family: ``steps`` model calls for the GEN_LENGTH positions (None:
    open-ended, threshold and EB, whose expected calls the exact program gives); ``knob``: the
    sampler's one number (eta of a corrector, gamma of EB, the threshold, Eso's alpha_0)."""

    family: str
    sampler: str  # the curve it belongs to
    steps: int | None
    knob: float | None = None

    @property
    def name(self) -> str:
        knob = "" if self.knob is None else f" {self.knob:g}"
        steps = "" if self.steps is None else f" {self.steps} steps"
        return f"{self.family} {self.sampler}{knob}{steps}"

    @property
    def nfe_per_token(self) -> float | None:
        """Model calls per generated position; None where it depends on the model (the
        report takes the exact expected calls instead)."""
        if self.steps is None:
            return None
        if self.family == "eso":  # chunks of the diffusion phase, then one call per AR token
            diffused = round(self.knob * GEN_LENGTH)
            return (min(self.steps, diffused) + GEN_LENGTH - diffused) / GEN_LENGTH
        return self.steps / GEN_LENGTH

    def config(self) -> Any:
        if self.family == "ar":
            return GenerationConfig(max_new_tokens=GEN_LENGTH, use_cache=False)
        if self.family == "eso":
            return EsoSamplerConfig(self.steps, alpha_0=self.knob)
        if self.family == "udm":
            if self.sampler == "ancestral":
                return UniformSamplerConfig(steps=self.steps)
            mode = self.sampler.removeprefix("psi-")
            times = LOOP_TIMES if mode == "loop" else {}
            return UniformSamplerConfig(steps=self.steps, psi=mode, eta=self.knob, **times)
        return SamplerConfig(self.absorbing_rule())

    def absorbing_rule(self) -> Any:
        if self.sampler == "ancestral":
            return Ancestral(self.steps)
        if self.sampler == "remdm-cap":
            return Remdm(self.steps, mode="cap", eta=self.knob)
        if self.sampler == "remdm-loop":
            return Remdm(self.steps, mode="loop", eta=self.knob, **LOOP_TIMES)
        if self.sampler == "eb":
            return EntropyBounded(self.knob)
        if self.sampler == "threshold":
            return Threshold(self.knob)
        return FixedCount(self.steps, remasking=self.sampler)


def loop_eta(family: str) -> float:
    """The largest eta the loop allows at LOOP_TIMES (the smaller of it and CORRECTOR_ETA)."""
    alpha_on = LOOP_TIMES["alpha_on"]
    bound = (1 - alpha_on) / alpha_on if family == "mdm" else 1 - alpha_on
    return min(CORRECTOR_ETA, round(bound, 12))


def corrector_settings() -> list[SamplerSetting]:
    """The plain ancestral samplers and their correctors at CORRECTED_STEPS."""
    rows = []
    for steps in CORRECTED_STEPS:
        for family, sampler in CORRECTOR_BASES:
            eta = loop_eta(family) if sampler.endswith("loop") else CORRECTOR_ETA
            rows.append(SamplerSetting(family, sampler, steps, eta))
    return rows


def sampler_settings(every: bool = True) -> list[SamplerSetting]:
    """The settings measured (bd steps are a multiple of its 3 blocks); without ``every``, the
    positive controls and each family's setting at 3 steps (the smoke scale's few)."""
    rows = [SamplerSetting("ar", "T=1", GEN_LENGTH)]
    for steps in (5, 3, 2, 1):
        rows.append(SamplerSetting("mdm", "random", steps))
    rows += [SamplerSetting("mdm", "low_confidence", s) for s in (5, 3)]
    rows += [SamplerSetting("mdm", "ancestral", s) for s in CORRECTED_STEPS]
    rows += [SamplerSetting("mdm", "eb", None, g) for g in (0.0, 0.1, 0.5, 2.0)]
    rows += [SamplerSetting("mdm", "threshold", None, c) for c in (0.9, 0.7, 0.5)]
    rows += [SamplerSetting("bd", "random", s) for s in (6, 3)]
    rows += [SamplerSetting("udm", "ancestral", s) for s in (2, *CORRECTED_STEPS)]
    rows += [s for s in corrector_settings() if s.sampler != "ancestral"]
    # Eso: one per step (a positive control), all left to right, and the few-step ones
    eso = [(1.0, 5), (0.0, 1), (ESO_TRAINED_ALPHA_0, 1), (ESO_TRAINED_ALPHA_0, 2), (1.0, 3)]
    rows += [SamplerSetting("eso", "alpha_0", steps, a) for a, steps in eso]
    if every:
        return rows
    at_budget = [
        r
        for r in rows
        if (r.steps == 3 and r.sampler in ("random", "ancestral", "remdm-cap", "psi-cap"))
        or (r.sampler == "eb" and r.knob == 0.5)
        or (r.family == "eso" and r.knob == 1.0 and r.steps == 3)
    ]
    return [r for r in rows if is_positive_control(r) or r in at_budget]


def is_positive_control(setting: SamplerSetting) -> bool:
    """Settings exact with the exact denoiser: AR, one token per step in random order, EB at
    gamma = 0 (one per step in an order read from the predictions), Eso one position per step
    and Eso all left to right."""
    one_per_step = {"mdm": GEN_LENGTH, "bd": 2 * (SEQ_LEN // BLOCK_SIZE)}
    eso_exact = setting.family == "eso" and (
        setting.knob == 0.0 or setting.steps == round(setting.knob * GEN_LENGTH)
    )
    return (
        setting.family == "ar"
        or (setting.sampler == "random" and one_per_step.get(setting.family) == setting.steps)
        or (setting.sampler == "eb" and setting.knob == 0.0)
        or eso_exact
    )


def spread_of(values: Sequence[float], geometric: bool = False) -> dict[str, Any]:
    """Mean and 95% t-interval over seeds (no interval below 2 seeds); ``geometric``: both on
    log values (ratios)."""
    spread = seed_spread(list(values), geometric)
    low = None if spread is None else spread.low
    high = None if spread is None else spread.high
    return {"values": list(values), "mean": spread.mean, "low": low, "high": high}


def interval_text(spread: dict[str, Any]) -> str:
    if spread["low"] is None:
        return f"{spread['mean']:.3g} (1 seed, no interval)"
    n = len(spread["values"])
    low, high = spread["low"], spread["high"]
    return f"{spread['mean']:.3g} [95% t-interval {low:.3g}, {high:.3g} over {n} seeds]"


def headline(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rule, on rows with ``family``, ``setting``, ``nfe_per_token``, ``trained`` and
    ``sampler`` (spreads of HEADLINE_METRIC): among the settings within HEADLINE_NFE, each
    family's lowest mean; the lowest family is named only when its interval lies below every
    other family's, else the headline says that no family is separated."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["nfe_per_token"] > HEADLINE_NFE + 1e-9:
            continue
        held = best.get(row["family"])
        if held is None or row["trained"]["mean"] < held["trained"]["mean"]:
            best[row["family"]] = row
    if not best:
        raise ValueError(f"no setting within NFE per token {HEADLINE_NFE}")
    ranked = sorted(best.values(), key=lambda r: r["trained"]["mean"])
    first, others = ranked[0], ranked[1:]
    separated = first["trained"]["high"] is not None and all(
        o["trained"]["low"] is not None and first["trained"]["high"] < o["trained"]["low"]
        for o in others
    )
    return {
        "separated": separated,
        "family": first["family"] if separated else None,
        "ranked": [(r["family"], r["setting"], r["trained"]["mean"]) for r in ranked],
        "text": headline_text(first, ranked, separated),
    }


def headline_text(first: dict[str, Any], ranked: list[dict[str, Any]], separated: bool) -> str:
    """The headline's words: each number a distance of its own (``trained`` to p, ``sampler``:
    the exact denoiser's q to p, ``to_exact``: between the two q's), never parts of one."""
    budget = f"At NFE per token <= {HEADLINE_NFE:g} (each family's best sampler there)"
    metric = HEADLINE_METRIC.upper()
    if separated:
        return (
            f"{budget}, the closest family to the truth is {first['family'].upper()} "
            f"({first['setting']}): its samples are at {metric} "
            f"{interval_text(first['trained'])} from the language. Beside it, two other "
            f"distances: the same sampler with the exact denoiser is at {metric} "
            f"{first['sampler']['mean']:.3g} from the language, and the trained network's "
            f"output is at {metric} {interval_text(first['to_exact'])} from that "
            "exact-denoiser output."
        )
    listed = "; ".join(
        f"{r['family'].upper()} ({r['setting']}) {interval_text(r['trained'])}" for r in ranked
    )
    return f"{budget}, no family is separated from the others by {metric}: {listed}."


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
