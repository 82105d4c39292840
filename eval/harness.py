"""The ``duolm`` model of lm-evaluation-harness, for AR and MDM runs, registered in lm-eval's
model registry and scoring each request as lm-eval's own ``hf`` backend scores the export.

    python -m eval.harness --model duolm --model_args checkpoint=runs/demo/ar \\
        --tasks my_task --include_path tasks/ --device cpu --batch_size 8
    duolm lm-eval ...                                       # the same command
    lm_eval.simple_evaluate(model="duolm", model_args={"checkpoint": "runs/demo/mdm"}, ...)

lm-eval (0.4) looks models up in its own registry and discovers none outside its package (no
entry points, no plugin folder; ``--include_path`` covers tasks only). Importing this module
registers "duolm" there, so ``lm_eval --model duolm`` alone does not find it; the two commands
above import it and then run lm-eval's own command line, with every one of its flags.

Requests are handled as ``hf`` handles them (lm-eval's ``TemplateLM`` for the context and
continuation split, its rolling windows, ``hf``'s truncation), so ``hf`` on ``duolm export``'s
folder gives the same per-item log-likelihoods for an AR run (tested to 1e-4). The MDM scores
each continuation by a Monte-Carlo NELBO whose noise is a function of the request alone (lm-eval's
seed and a hash of the request's tokens), so batch size and batch mates change nothing. The
arguments and the estimator are described in docs/evaluation.md ("lm-evaluation-harness").

Requires ``pip install lm-eval`` (the ``harness`` extra; not a dependency of the project).
"""

from __future__ import annotations

import inspect
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch

try:
    import lm_eval.models  # noqa: F401  (lm-eval's own models first: see register())
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import model_registry
except ImportError as error:  # pragma: no cover - exercised only without lm-eval
    raise ImportError("eval.harness needs lm-evaluation-harness: pip install lm-eval") from error

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval import harness_scores
from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import device_argument
from shared.errors import CheckpointError, ConfigError, result_or_status
from shared.objective import objective_for_run
from shared.sampling import SamplingConfig

log = logging.getLogger(__name__)

MODEL_NAME = "duolm"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LIKELIHOODS = ("nelbo", "chain_rule")
ESTIMATORS = ("time", "count")


def _integer(name: str, value: Any, least: int = 1, most: int | None = None, why: str = ""):
    """``value`` (an int, or its text as lm-eval's command line passes it) as an int in
    least..most, else one line naming the argument and that range."""
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if (
        number is None
        or str(number) != str(value).strip()
        or number < least
        or (most is not None and number > most)
    ):
        valid = f"an integer >= {least}" if most is None else f"an integer in {least}..{most}"
        raise ConfigError(f"{name}={value!r} must be {valid}{why}")
    return number


def check_choices(unknown, checkpoint, mdm_likelihood, estimator, dtype) -> None:
    """The model arguments that name a choice, each refused in one line naming the valid ones."""
    if unknown:
        valid = ", ".join(argument_names())
        raise ConfigError(
            f"unknown duolm model argument(s) {', '.join(sorted(unknown))}; valid: {valid}"
        )
    if not checkpoint:
        raise ConfigError("checkpoint= is required: a duolm run folder or one of its checkpoints")
    if mdm_likelihood not in LIKELIHOODS:
        raise ConfigError(f"mdm_likelihood={mdm_likelihood!r} must be one of {LIKELIHOODS}")
    if estimator is not None and estimator not in ESTIMATORS:
        raise ConfigError(f"estimator={estimator!r} must be one of {ESTIMATORS}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")


def load_run(checkpoint: str, device: torch.device):
    """(model, tokenizer, state) of an AR or MDM run; anything else is one line."""
    try:
        model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint), device)
    except (CheckpointError, FileNotFoundError) as error:
        raise ConfigError(f"checkpoint={checkpoint!r} is not a duolm run ({error})") from None
    if state["objective"] not in ("ar", "mdm"):
        raise ConfigError(
            f"checkpoint={checkpoint!r} is a {state['objective']!r} run; the duolm lm-eval model "
            "scores 'ar' and 'mdm' runs"
        )
    return model, tokenizer, state


class DuoLM(TemplateLM):
    """lm-eval's view of a duolm run (AR or MDM); see docs/evaluation.md for every argument."""

    def __init__(
        self,
        checkpoint: str | None = None,
        *,
        batch_size: int | str = 16,
        max_batch_size: int | str | None = None,
        max_length: int | str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        mdm_likelihood: str = "nelbo",
        estimator: str | None = None,
        draws: int | str = 16,
        seed: int | str | None = None,
        max_gen_toks: int | str = 64,
        diffusion_steps: int | str = 64,
        **unknown: Any,
    ):
        super().__init__()
        check_choices(unknown, checkpoint, mdm_likelihood, estimator, dtype)
        self.batch_size_per_gpu = _integer("batch_size", batch_size)
        del max_batch_size  # lm-eval passes it for batch_size=auto, which duolm does not do
        self.draws = _integer("draws", draws, least=2)
        self.max_gen_toks_ = _integer("max_gen_toks", max_gen_toks)
        self.diffusion_steps = _integer("diffusion_steps", diffusion_steps)
        self.fixed_seed = None if seed is None else _integer("seed", seed, least=0)
        self._device = torch.device(_device(device))
        self.model, self.tokenizer, self.state = load_run(checkpoint, self._device)
        self.kind = self.state["objective"]
        self.model.to(DTYPES[dtype])
        self.dtype, self.checkpoint, self.mdm_likelihood = dtype, str(checkpoint), mdm_likelihood
        config = self.state["train_config"]
        options = {"estimator": estimator} if estimator and self.kind == "mdm" else {}
        self.objective = objective_for_run(self.kind, config, self.tokenizer, **options)
        positions = self.model.config.max_seq_len
        # the row length the run trained on: what the model has seen, BOS included
        trained = min(int(config.get("seq_len") or positions), positions)
        self._max_length = trained
        if max_length is not None:
            why = f" (the model's positions; the run trained on rows of {trained})"
            self._max_length = _integer("max_length", max_length, 2, positions, why)
        self.item_records: list[dict[str, Any]] = []  # per MDM item: its estimate and stderr
        self._stderrs: list[float] = []  # of the last _loglikelihood_tokens call, in its order

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's constructor call, with ``--model_args`` winning over the batch size and
        device lm-eval adds: its command line always adds them (``--batch_size`` defaults to
        1, ``--device`` to cuda:0), so a key in both was a TypeError before any check."""
        added = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**(added | dict(arg_dict)))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(
            lm_utils.simple_parse_args_string(arg_string), additional_config
        )

    # ---- what lm-eval reads

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tokenizer.eos_id  # BOS: every training row opens with the end-of-text id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self.max_gen_toks_

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_gpu

    @property
    def seed(self) -> int:
        """The explicit ``seed=``, else the torch seed lm-eval set (``--seed``'s third value),
        read when requests are scored so a model built before ``simple_evaluate`` seeds too."""
        return self.fixed_seed if self.fixed_seed is not None else torch.initial_seed()

    @property
    def likelihood_kind(self) -> str:
        if self.kind == "ar":
            return "exact"
        if self.mdm_likelihood == "chain_rule":
            return "exact (left-to-right)"
        return f"bound (NELBO, {self.objective.estimator} estimator, {self.draws} draws)"

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        # Our tokenizer adds no specials (neither does the export's): BOS comes from lm-eval's
        # prefix token where hf puts it, an empty context and the first rolling window.
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def get_model_info(self) -> dict[str, Any]:
        """Recorded in lm-eval's results under "config": what the scores mean, and for the MDM's
        NELBO every item's estimate with its Monte-Carlo standard error."""
        return {"duolm": harness_info(self) | {"items": self.item_records}}

    # ---- log-likelihoods

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        self._record(requests, [score for score, _ in results], self._stderrs)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        # The MDM sees context and continuation in one row of max_length positions; the AR's
        # input is one token shorter than the tokens it covers (the last is only predicted).
        span = self.max_length if self.kind == "ar" else self.max_length - 1
        windows, owner = [], []
        for index, (text,) in enumerate(r.args for r in requests):
            for window in lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=span,
                context_len=1,
            ):
                windows.append((None, *lm_utils.make_disjoint_window(window)))
                owner.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals, variances = [0.0] * len(requests), [0.0] * len(requests)
        for index, (score, _), stderr in zip(owner, scores, self._stderrs):
            totals[index] += score
            variances[index] += stderr**2
        self._record(requests, totals, [math.sqrt(v) for v in variances])
        for (text,), total in zip((r.args for r in requests), totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def _record(self, requests, scores: list[float], stderrs: list[float]) -> None:
        if self.kind != "mdm" or self.mdm_likelihood != "nelbo":
            return
        for request, score, stderr in zip(requests, scores, stderrs):
            self.item_records.append(
                {
                    "task": getattr(request, "task_name", None),
                    "doc_id": getattr(request, "doc_id", None),
                    "idx": getattr(request, "idx", None),
                    "loglikelihood": score,
                    "stderr": stderr,
                }
            )

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        """(log-likelihood, is_greedy) per ((context, continuation), context ids, continuation
        ids), in input order; their Monte-Carlo standard errors land in ``self._stderrs``."""
        rows, n_scored = [], []
        for _, context, continuation in requests:
            if not 0 < len(continuation) <= self.max_length - (self.kind != "ar"):
                raise ConfigError(
                    f"a continuation of {len(continuation)} tokens does not fit "
                    f"max_length={self.max_length}; raise max_length (up to the model's "
                    f"{self.model.config.max_seq_len} positions)"
                )
            # hf's truncation: keep the last max_length + 1 tokens (the AR's input is all but
            # the last); the MDM's row holds max_length tokens
            keep = self.max_length + (self.kind == "ar")
            rows.append((list(context) + list(continuation))[-keep:])
            n_scored.append(len(continuation))
        # Requests that share a forward pass (eval/harness_scores.py) are scored as one group;
        # groups go longest first, as hf's collator does: each batch is padded to its first row
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            key = tuple(row[:-1]) if self.kind == "ar" else (tuple(row), n_scored[i])
            groups.setdefault(key, []).append(i)
        order = sorted(groups.values(), key=lambda group: -len(rows[group[0]]))
        scores, greedy = [0.0] * len(rows), [False] * len(rows)
        stderrs = [0.0] * len(rows)
        seed = self.seed
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            for group, found in zip(batch, self._score_batch(rows, n_scored, batch, seed)):
                for i, (score, is_greedy, stderr) in zip(group, found):
                    scores[i], greedy[i], stderrs[i] = score, is_greedy, stderr
        self._stderrs = stderrs
        for (request, _, _), score, is_greedy in zip(requests, scores, greedy):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, (score, is_greedy))
        return list(zip(scores, greedy))

    @torch.no_grad()
    def _score_batch(self, rows, n_scored, groups: list[list[int]], seed: int):
        """Per group of the batch, (log-likelihood, is_greedy, stderr) per member."""
        pad_id = self.tokenizer.pad_id
        if self.kind == "ar":
            return harness_scores.ar_scores(self.model, rows, n_scored, groups, pad_id)
        heads, spans = [rows[g[0]] for g in groups], [n_scored[g[0]] for g in groups]
        if self.mdm_likelihood == "chain_rule":
            mask_id = self.objective.mask_id
            found = harness_scores.chain_rule_scores(self.model, mask_id, heads, spans, pad_id)
        else:
            found = harness_scores.nelbo_scores(
                self.model, self.objective, heads, spans, self.draws, seed, pad_id
            )
        return [[one] * len(group) for one, group in zip(found, groups)]

    # ---- generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        outputs = []
        for context, gen_kwargs in (r.args for r in requests):
            until = gen_kwargs.get("until", []) if isinstance(gen_kwargs, dict) else []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            max_new = min(max_new, self.max_length - 1)  # BOS takes one position
            room = self.max_length - 1 - max_new
            prompt = self.tok_encode(context)[-room:] if room else []
            text = self._generate(prompt, max_new)
            for stop in until:
                if stop and stop in text:
                    text = text[: text.index(stop)]
            outputs.append(text)
        return outputs

    def _generate(self, prompt: list[int], max_new: int) -> str:
        if self.kind == "ar":
            engine = ARGenerator(self.model, self.tokenizer)
            config = GenerationConfig(
                max_new_tokens=max_new, sampling=SamplingConfig(temperature=0.0)
            )
            result = engine.generate([[self.tokenizer.eos_id, *prompt]], config, seed=self.seed)
            return self.tokenizer.decode(result.tokens[0])
        generator = DiffusionGenerator(self.model, self.tokenizer, self.state)
        config = SamplerConfig(
            FixedCount(steps=min(self.diffusion_steps, max_new), remasking="low_confidence"),
            sampling=SamplingConfig(temperature=0.0),
        )
        return generator.generate([prompt], max_new, config, seed=self.seed, eos="stop").texts[0]


def _device(device: str | None) -> str:
    """``device``, or CUDA when there is one; lm-eval's command line passes "cuda:0" by default,
    so on a machine without CUDA it falls back to the CPU, as lm-eval's ``hf`` backend does.
    Any other device must be one this machine runs on (``--device tpu`` is one line)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        log.warning("device=%s: no CUDA here, scoring on the CPU", device)
        return "cpu"
    return str(device_argument(str(device)))


def argument_names() -> list[str]:
    """The model arguments ``--model_args`` takes, as ``DuoLM`` declares them."""
    parameters = inspect.signature(DuoLM.__init__).parameters.values()
    return [p.name for p in parameters if p.name != "self" and p.kind != p.VAR_KEYWORD]


def harness_info(lm: DuoLM) -> dict[str, Any]:
    """What to record beside harness scores: the run, its objective and what its likelihoods
    mean (for the MDM's NELBO the estimator, draws and seed that make it reproducible)."""
    nelbo = lm.kind == "mdm" and lm.mdm_likelihood == "nelbo"
    return {
        "checkpoint": lm.checkpoint,
        "objective": lm.kind,
        "likelihood": lm.likelihood_kind,
        "estimator": lm.objective.estimator if nelbo else None,
        "draws": lm.draws if nelbo else None,
        "seed": lm.seed if nelbo else None,
        "max_length": lm.max_length,
        "dtype": lm.dtype,
        "tokenizer": lm.tokenizer.kind,
    }


def register() -> None:
    """Register "duolm" in lm-eval's model registry, by module path (the registry imports
    ``eval.harness`` when the name is first used), once per process.

    lm-eval fills its registry with its own models only when the registry is empty, so they
    are imported (``lm_eval.models``, at the top) before this adds to it."""
    if MODEL_NAME not in model_registry:
        # by path, not the class: under ``python -m eval.harness`` this file runs as __main__
        model_registry.register(MODEL_NAME, target="eval.harness:DuoLM")


register()


def main(argv: list[str] | None = None) -> int:
    """lm-eval's own command line, with "duolm" registered: ``python -m eval.harness`` or
    ``duolm lm-eval`` takes exactly lm-eval's flags. A bad model argument is one line, exit 2."""
    from lm_eval.__main__ import cli_evaluate

    argv = sys.argv[1:] if argv is None else argv
    program, sys.argv = sys.argv, ["lm-eval", *argv]
    try:
        _, status = result_or_status(cli_evaluate)
    finally:
        sys.argv = program
    return status


if __name__ == "__main__":
    raise SystemExit(main())
