"""The front door: the exact distribution q of strings a family's sampler produces with any
"model" (an exact denoiser, giving the sampler's own error, or a trained network), and its
divergences to the language's p (and, by ``outcomes.divergences``, to another sampler's q).

    q = sampler_distribution("mdm", model, language, tokenizer, SamplerConfig(FixedCount(4)), 4)
    sampler_error("mdm", model, language, tokenizer, config, 4)  # kl_qp, kl_pq, tv, dropped, ...

Configs: "ar" takes ``arlm.generate.GenerationConfig`` (its ``sampling``; ``gen_length`` is the
token limit), "mdm" and "bd" ``dllm.sampler.SamplerConfig``, "udm" ``UniformSamplerConfig``,
"eso" ``EsoSamplerConfig`` (its exact denoiser is the absorbing one; its alpha_0, where the
config has none, is ``train_config.alpha_0``).
``state`` is the checkpoint's state where the sampler reads it (bd: ``train_config.block_size``;
an ancestral rule without a schedule: ``train_config.schedule``). ``min_prob`` > 0 prunes draws
of probability <= min_prob (a trained network puts a little mass on every id) and reports the
pruned mass as ``dropped``; 0 (the default) is exact.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any

import torch

from arlm.generation_types import GenerationConfig
from dllm.block.sampler import BlockCausalForward, grid_blocks
from dllm.eso.sampler import EsoSamplerConfig
from dllm.masked.sampler import block_bounds
from dllm.predictors import CountingModel, FullForward
from dllm.sampler import SamplerConfig, with_model_schedule
from dllm.uniform.objective import support_ids
from dllm.uniform.sampler import UniformSamplerConfig
from eval.synthetic.exact.absorbing import Layout, absorbing_distribution
from eval.synthetic.exact.autoregressive import ar_distribution
from eval.synthetic.exact.denoisers import ExactAbsorbing, ExactUniform
from eval.synthetic.exact.eso import denoiser_predict, eso_distribution, network_predict
from eval.synthetic.exact.outcomes import (
    check_exact_language,
    check_state_count,
    divergences,
    language_distribution,
    outcome,
)
from eval.synthetic.exact.uniform import Classes, full_support, uniform_distribution
from eval.synthetic.likelihood import symbol_ids
from shared.data.synthetic.base import Language
from shared.errors import ConfigError
from shared.tokenizer import Tokenizer

CONFIG_TYPES = {
    "ar": GenerationConfig,
    "mdm": SamplerConfig,
    "bd": SamplerConfig,
    "udm": UniformSamplerConfig,
    "eso": EsoSamplerConfig,
}


@dataclass(frozen=True)
class SamplerDistribution:
    """``q``: probability of each sample (a string, or None for an invalid one); ``p``: the
    language's; ``dropped``: probability pruned by ``min_prob`` (0 when exact); ``impossible``:
    the mass that reaches a canvas no row of the language holds (an exact absorbing denoiser's
    sampler only, where the denoiser's answer there is a completion; None elsewhere)."""

    q: dict[str | None, float]
    p: dict[str | None, float]
    dropped: float
    impossible: float | None = None
    calls: float | None = None  # expected model calls of one row (the absorbing families)


@dataclass(frozen=True)
class Setting:
    """What every family's computation needs besides its config."""

    model: Any
    tokenizer: Tokenizer
    gen_length: int
    state: Mapping[str, Any]
    min_prob: float
    symbols: dict[int, str]

    def decode(self, generated) -> str | None:
        return outcome(generated, self.symbols, self.tokenizer.eos_id)


def check_setting(family: str, config: Any, language: Language, gen_length: int) -> None:
    """Refuse, in one line, what the exact computation cannot do."""
    check_exact_language(language)
    if family not in CONFIG_TYPES:
        raise ConfigError(f"family={family!r} is unknown; valid: {sorted(CONFIG_TYPES)}")
    wanted = CONFIG_TYPES[family]
    if not isinstance(config, wanted):
        raise ConfigError(
            f"the {family} sampler takes a {wanted.__name__}, not {type(config).__name__}"
        )
    if gen_length < language.max_len + 1:
        raise ConfigError(
            f"gen_length={gen_length} cannot hold the longest string of {language.name} and "
            f"its EOS; use gen_length >= {language.max_len + 1}"
        )
    if isinstance(config, SamplerConfig) and (config.cache != "none" or config.cfg_scale > 0):
        raise ConfigError(
            f"cache={config.cache!r}, cfg_scale={config.cfg_scale}: the exact distribution "
            "follows the exact predictor without guidance (cache='none', cfg_scale=0); an "
            "approximate cache makes predictions depend on the path"
        )
    if isinstance(config, GenerationConfig) and (
        config.stop_sequences or config.stop_strings or not config.stop_on_eos
    ):
        raise ConfigError("the exact AR distribution stops at EOS only (no stop sequences)")
    row_symbols = len(language.alphabet) + 2  # EOS and PAD, plus [MASK] or the other ids
    check_state_count(f"{family} sampler", (row_symbols + 1) ** gen_length, language)


def absorbing(family: str, config: SamplerConfig, setting: Setting):
    model, length = setting.model, setting.gen_length + 1
    mask_id = model.config.vocab_size - 1
    canvas = (setting.tokenizer.eos_id,) + (mask_id,) * setting.gen_length
    region = (1, length)
    config = with_model_schedule(config, setting.state)
    counter = CountingModel(model)
    if family == "bd":
        size = int(setting.state["train_config"]["block_size"])
        if config.block_length not in (None, size):
            raise ConfigError(f"block_length={config.block_length} must be None or {size}")
        blocks = grid_blocks(region, size, length)
        predictor = BlockCausalForward(counter, mask_id, size)
    else:
        blocks = block_bounds(region, config.block_length)
        predictor = FullForward(counter, mask_id)
    config.validate()
    config.strategy.steps_per_block(len(blocks))
    memo: dict = {}

    def predict(row, block):
        if (row, block) not in memo:
            memo[(row, block)] = predictor(torch.tensor([row]), block)[0].cpu()
        return memo[(row, block)]

    layout = Layout(
        canvas,
        blocks,
        mask_id,
        setting.tokenizer.eos_id,
        1,
        lambda c: setting.decode(c[1:]),
        model.possible if isinstance(model, ExactAbsorbing) else None,
    )
    return absorbing_distribution(predict, config, layout, setting.min_prob)


def uniform_classes(setting: Setting, language: Language) -> Classes:
    """Lumped classes for the exact denoiser, every support id for any other model."""
    tokenizer, model = setting.tokenizer, setting.model
    n_support = model.config.vocab_size - 1
    if isinstance(model, ExactUniform):
        tracked = tuple(model.tokens.ids)
        support = support_ids(torch.arange(n_support), tokenizer.pad_id).tolist()
        # None when the symbols and EOS are the whole support (a tokenizer of the alphabet only)
        other = next((i for i in support if i not in tracked), None)
        return Classes(tracked, other, n_support, tokenizer.pad_id)
    check_state_count(
        "udm sampler over the model's support", n_support**setting.gen_length, language
    )
    return full_support(n_support, tokenizer.pad_id)


def uniform(config: UniformSamplerConfig, setting: Setting, language: Language):
    classes = uniform_classes(setting, language)
    n_support = classes.n_support
    support = support_ids(torch.arange(n_support), classes.pad_id)
    free = torch.ones(1, setting.gen_length + 1, dtype=torch.bool)
    free[0, 0] = False

    def logits_of(row, t):
        tokens = torch.tensor([[setting.tokenizer.eos_id, *(classes.tokens[c] for c in row)]])
        time = torch.full((1,), t)  # float32, as the sampler builds it
        out = setting.model(tokens, attention="bidirectional", output_mask=free, time=time)
        return out[:, support].cpu()

    def decode(row):
        return setting.decode([classes.tokens[c] for c in row])

    return uniform_distribution(logits_of, classes, config, setting.gen_length, decode), 0.0


def eso(config: EsoSamplerConfig, setting: Setting):
    model = setting.model
    mask_id = model.config.vocab_size - 1
    canvas = (setting.tokenizer.eos_id,) + (mask_id,) * setting.gen_length
    alpha_0 = float(setting.state.get("train_config", {}).get("alpha_0", 0.5))
    exact = isinstance(model, ExactAbsorbing)
    predict = (denoiser_predict if exact else network_predict)(model, canvas, mask_id)
    rows = eso_distribution(predict, config, alpha_0, canvas, mask_id, setting.min_prob)
    q: dict[str | None, float] = defaultdict(float)
    for row, mass in rows.items():
        q[setting.decode(row[1:])] += mass
    impossible = None
    if exact:
        impossible = sum(mass for row, mass in rows.items() if not model.possible(row))
    return dict(q), max(0.0, 1.0 - sum(rows.values())), impossible


def autoregressive(config: GenerationConfig, setting: Setting):
    eos_id = setting.tokenizer.eos_id

    def logits_after(prefix):
        tokens = torch.tensor([prefix])
        last = torch.zeros_like(tokens, dtype=torch.bool)
        last[0, -1] = True
        return setting.model(tokens, attention="causal", output_mask=last)[0].cpu()

    return ar_distribution(
        logits_after,
        eos_id,
        eos_id,
        setting.gen_length,
        config.sampling,
        setting.decode,
        setting.min_prob,
    )


def sampler_distribution(
    family: str,
    model: Any,
    language: Language,
    tokenizer: Tokenizer,
    config: Any,
    gen_length: int,
    *,
    state: Mapping[str, Any] | None = None,
    min_prob: float = 0.0,
) -> SamplerDistribution:
    """The exact q of ``family``'s sampler under ``config`` with ``model`` (module docstring)."""
    check_setting(family, config, language, gen_length)
    symbols = dict(zip(symbol_ids(language, tokenizer), language.alphabet))
    setting = Setting(model, tokenizer, gen_length, state or {}, min_prob, symbols)
    impossible = calls = None
    with torch.no_grad():
        try:
            if family == "ar":
                q, dropped = autoregressive(config, setting)
            elif family == "udm":
                q, dropped = uniform(config, setting, language)
            elif family == "eso":
                q, dropped, impossible = eso(config, setting)
            else:
                result = absorbing(family, config, setting)
                q, dropped, impossible, calls = astuple(result)
        except ConfigError:
            raise
        except ValueError as exc:  # the samplers' own checks of a setting
            raise ConfigError(str(exc)) from exc
    return SamplerDistribution(q, language_distribution(language), dropped, impossible, calls)


def sampler_error(*setting: Any, **options: Any) -> dict[str, float]:
    """KL(q||p), KL(p||q), total variation, the pruned mass and the impossible mass (None where
    not computed) of the sampler's q, for the setting ``sampler_distribution`` takes (the same
    arguments, passed through)."""
    dist = sampler_distribution(*setting, **options)
    return divergences(dist.q, dist.p) | {"dropped": dist.dropped, "impossible": dist.impossible}
