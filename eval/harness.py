"""An ``lm-evaluation-harness`` model for checkpoints of either objective.

    import lm_eval
    from eval.harness import DuoLM
    lm_eval.simple_evaluate(model=DuoLM("runs/demo/mdm"), tasks=[...])

- ``loglikelihood``: AR exact log p(continuation | context); MDM the negative NELBO of the
  continuation with the context visible (``samples`` noise draws; a *bound*, so
  ``likelihood_kind`` says "bound") or, with ``mdm_likelihood="chain_rule"``, the exact
  left-to-right chain rule. ``is_greedy``: AR, every continuation token is the argmax given its
  prefix; MDM, every continuation token is the argmax when the whole continuation is masked.
- ``loglikelihood_rolling``: the text cut into windows of the model's context, each window
  scoring only tokens not scored before (AR windows overlap to keep full context; MDM windows
  are disjoint chunks scored by the NELBO).
- ``generate_until``: greedy AR decoding with the KV cache, or the MDM's low-confidence
  fixed-count sampler, cut at the first stop string.

Requires ``pip install lm-eval`` (not a dependency of the project).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    from lm_eval.api.model import LM
except ImportError as error:  # pragma: no cover - exercised only without lm-eval
    raise ImportError("eval.harness needs lm-evaluation-harness: pip install lm-eval") from error

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval.likelihood import ar_nll, continuation_rows, mdm_chain_rule_nll, mdm_nelbo
from shared.checkpoint import load_model_from_checkpoint
from shared.objective import objective_for_run
from shared.sampling import SamplingConfig


class DuoLM(LM):
    def __init__(
        self,
        checkpoint: str,
        *,
        samples: int = 16,
        mdm_likelihood: str = "nelbo",
        batch_size: int = 16,
        max_gen_toks: int = 64,
        diffusion_steps: int = 64,
        seed: int = 0,
        device: str = "cpu",
    ):
        super().__init__()
        if mdm_likelihood not in ("nelbo", "chain_rule"):
            raise ValueError(f"mdm_likelihood={mdm_likelihood!r} must be 'nelbo' or 'chain_rule'")
        self.model, self.tokenizer, self.state = load_model_from_checkpoint(
            Path(checkpoint), device
        )
        self.kind = self.state["objective"]
        self.objective = objective_for_run(self.kind, self.state["train_config"], self.tokenizer)
        self.samples, self.mdm_likelihood = samples, mdm_likelihood
        self.batch_size, self.max_gen_toks = batch_size, max_gen_toks
        self.diffusion_steps, self.seed, self._device = diffusion_steps, seed, device
        self.max_length = self.model.config.max_seq_len
        self.token_bytes = self.tokenizer.token_bytes()

    @property
    def likelihood_kind(self) -> str:
        if self.kind == "ar":
            return "exact"
        return "exact (left-to-right)" if self.mdm_likelihood == "chain_rule" else "bound (NELBO)"

    # ---- scoring

    def _fit(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """Drop the oldest context tokens so BOS + context + continuation fits the model."""
        room = self.max_length - 1 - len(continuation)
        if room < 0:
            raise ValueError(
                f"a continuation of {len(continuation)} tokens does not fit the model's "
                f"context of {self.max_length}"
            )
        return context[len(context) - room :] if len(context) > room else context, continuation

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
        rows, scored = continuation_rows(
            [p for p, _ in pairs],
            [c for _, c in pairs],
            bos_id=self.tokenizer.eos_id,
            pad_id=self.tokenizer.pad_id,
        )
        rows_np = rows.numpy()
        if self.kind == "ar":
            estimate = ar_nll(
                self.model,
                self.objective,
                rows_np,
                self.token_bytes,
                batch_size=self.batch_size,
                device=self._device,
                scored=scored,
            )
        elif self.mdm_likelihood == "chain_rule":
            estimate = mdm_chain_rule_nll(
                self.model,
                self.objective,
                rows_np,
                self.token_bytes,
                batch_size=self.batch_size,
                device=self._device,
                scored=scored,
            )
        else:
            estimate = mdm_nelbo(
                self.model,
                self.objective,
                rows_np,
                self.token_bytes,
                samples=self.samples,
                batch_size=self.batch_size * self.samples,
                seed=self.seed,
                device=self._device,
                scored=scored,
            )
        return [-nats for nats in estimate.row_nats]

    @torch.no_grad()
    def _is_greedy(self, context: list[int], continuation: list[int]) -> bool:
        rows, scored = continuation_rows(
            [context], [continuation], bos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id
        )
        rows, scored = rows.to(self._device), scored.to(self._device)
        if self.kind == "ar":
            logits = self.model(rows[:, :-1], attention="causal")
            predicted = logits.argmax(-1)[scored[:, 1:]]
        else:
            mask_id = self.objective.mask_id
            noised = torch.where(scored, torch.full_like(rows, mask_id), rows)
            logits = self.model(noised, attention="bidirectional", output_mask=scored)
            predicted = logits[:, :mask_id].argmax(-1)
        return bool((predicted == rows[scored]).all())

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [
            self._fit(self.tokenizer.encode(context), self.tokenizer.encode(continuation))
            for context, continuation in (r.args for r in requests)
        ]
        scores = self._score(pairs)
        return [(score, self._is_greedy(*pair)) for score, pair in zip(scores, pairs)]

    def loglikelihood_rolling(self, requests) -> list[float]:
        results = []
        for (text,) in (r.args for r in requests):
            ids = self.tokenizer.encode(text)
            window = self.max_length - 1
            pairs, scored_upto = [], 0
            while scored_upto < len(ids):
                end = min(len(ids), scored_upto + window)
                if self.kind == "ar":  # full context: the window ends at `end`
                    start = max(0, end - window)
                    pairs.append((ids[start:scored_upto], ids[scored_upto:end]))
                else:  # disjoint chunks: the NELBO of each chunk from BOS
                    pairs.append(([], ids[scored_upto:end]))
                scored_upto = end
            results.append(float(sum(self._score(pairs))) if pairs else 0.0)
        return results

    # ---- generation

    def generate_until(self, requests) -> list[str]:
        outputs = []
        for context, gen_kwargs in (r.args for r in requests):
            until = gen_kwargs.get("until", []) if isinstance(gen_kwargs, dict) else []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            prompt = self.tokenizer.encode(context)
            prompt = prompt[-(self.max_length - 1 - max_new) :] if max_new < self.max_length else []
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


def harness_info(lm: DuoLM) -> dict[str, Any]:
    """What to record beside harness scores: the objective and what its likelihoods mean."""
    return {
        "objective": lm.kind,
        "likelihood": lm.likelihood_kind,
        "samples": lm.samples if lm.kind == "mdm" else None,
        "max_length": lm.max_length,
        "tokenizer": lm.tokenizer.kind,
        "numpy": np.__version__,
    }
