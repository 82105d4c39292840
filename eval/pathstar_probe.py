"""The path-star probe: does a model find the path from the centre of a star graph to a goal?

Each held-out example (``shared.data.synthetic.pathstar``) is split at its ``=``: the model gets
the prompt (shuffled edges, start, goal) and writes the answer (the ``arm + 1`` path labels),
which is compared with the exact solver's path. ``first_step`` (the node after the start is on
the goal's arm) is the step the Clever-Hans shortcut of teacher-forced AR training gets right only
by chance, 1/degree (Bachmann & Nagarajan 2024); the rest of the path follows from it by unique
children. Decoding is deterministic:

* AR: greedy decoding (``arlm.generate.ARGenerator``, temperature 0) of ``arm + 1`` tokens after
  ``[BOS] + prompt``. The uncached reference path is used: the answers are a few tokens long.
* MDM: the padded training row ``[BOS] + prompt + answer + [EOS] + PAD`` with the answer masked,
  filled by ``dllm.generator.DiffusionGenerator`` with ``FixedCount`` (argmax tokens, one position
  per step by default, the most confident first under ``strategy="low_confidence"``), so the
  model can decode the path from whichever end it is sure of, such as the goal end where every
  node has a unique parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from arlm.generate import ARGenerator, GenerationConfig
from dllm.canvas import Canvas
from dllm.generate import SamplerConfig
from dllm.generator import DiffusionGenerator
from dllm.strategies import FixedCount
from eval.synthetic_likelihood import language_rows, symbol_ids
from shared.data.synthetic.pathstar import (
    PathStarLanguage,
    check_path,
    parse_example,
    prompt_and_answer,
    shortcut_answer,
    solve,
)
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

UNKNOWN = "?"  # stands for a generated token that is no symbol of the language


def _texts(tokenizer: Tokenizer, language: PathStarLanguage, rows: Sequence[Sequence[int]]):
    symbol_of = dict(zip(symbol_ids(language, tokenizer), language.alphabet))
    return ["".join(symbol_of.get(int(t), UNKNOWN) for t in row) for row in rows]


@torch.no_grad()
def ar_answers(
    model: nn.Module,
    tokenizer: Tokenizer,
    language: PathStarLanguage,
    prompts: Sequence[str],
    *,
    batch_size: int = 256,
) -> list[str]:
    """Greedy AR answers (``arm + 1`` tokens) after ``[BOS] + prompt`` for each prompt."""
    generator = ARGenerator(model, tokenizer)
    config = GenerationConfig(
        max_new_tokens=language.arm + 1,
        sampling=SamplingConfig(temperature=0),
        stop_on_eos=False,
        use_cache=False,
    )
    out: list[str] = []
    for begin in range(0, len(prompts), batch_size):
        ids = [
            [tokenizer.eos_id, *tokenizer.encode(p)] for p in prompts[begin : begin + batch_size]
        ]
        out += _texts(tokenizer, language, generator.generate(ids, config).tokens)
    return out


def mdm_answers(
    model: nn.Module,
    tokenizer: Tokenizer,
    language: PathStarLanguage,
    strings: Sequence[str],
    seq_len: int,
    *,
    steps: int | None = None,
    strategy: str = "low_confidence",
    batch_size: int = 256,
    seed: int = 0,
) -> list[str]:
    """MDM answers: the answer positions of each padded row masked and filled greedily in
    ``steps`` steps (default: one position per step) under the ``strategy`` remasking rule."""
    length = language.arm + 1
    config = SamplerConfig(
        FixedCount(steps=steps or length, remasking=strategy),
        sampling=SamplingConfig(temperature=0),
    )
    generator = DiffusionGenerator(model, tokenizer)
    begin_answer = 1 + language.max_len - length  # BOS, then the prompt
    out: list[str] = []
    for begin in range(0, len(strings), batch_size):
        chunk = strings[begin : begin + batch_size]
        rows = torch.as_tensor(language_rows(chunk, tokenizer, seq_len, language), dtype=torch.long)
        rows[:, begin_answer : begin_answer + length] = generator.mask_id
        canvas = Canvas(rows, generator.mask_id)
        filled = generator.fill(canvas, config, seed=seed + begin, eos="none").raw.tokens
        out += _texts(tokenizer, language, filled[:, begin_answer : begin_answer + length].tolist())
    return out


def pathstar_probe(
    model: nn.Module,
    tokenizer: Tokenizer,
    language: PathStarLanguage,
    objective: str,
    seq_len: int,
    prompts: Sequence[str],
    *,
    steps: int | None = None,
    strategy: str = "low_confidence",
    batch_size: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Ask the model for the path of each held-out example in ``prompts`` (whole example strings,
    e.g. ``language.sample(n, seed)``; their answers are hidden from the model).

    ``objective``: "ar" (greedy decoding) or "mdm" (masked answer filled greedily; ``steps`` and
    ``strategy``, a ``FixedCount`` remasking rule, set the unmasking order). ``seq_len``: the
    model's training row length (at least ``language.max_len + 2``). ``seed`` seeds the diffusion
    sampler's generators (unused by argmax decoding, kept for reproducibility) and the shortcut
    baseline.

    Returns per-example ``answers``, ``exact_match_per_example`` (the whole path equals the
    solver's) and ``first_step_per_example`` (the node after the start is right), their means
    ``exact_match`` and ``first_step``, ``node_accuracy`` (the fraction of path positions right),
    ``n``, ``chance_first_step`` = 1/degree and, on the same examples, the first-step accuracy of
    the Clever-Hans shortcut (``shortcut_first_step``, a random child of the start).
    """
    if objective not in ("ar", "mdm"):
        raise ValueError(f"objective={objective!r}; valid: 'ar', 'mdm'")
    if not prompts:
        raise ValueError("prompts is empty: give held-out examples, e.g. language.sample(n, seed)")
    strings = list(prompts)
    language_rows(strings, tokenizer, seq_len, language)  # checks lengths and one token per symbol
    questions, truths, rng, shortcut = [], [], np.random.default_rng(seed), []
    for string in strings:
        question, answer = prompt_and_answer(string)
        edges, start, goal, _ = parse_example(string)
        if len(string) != language.max_len or not check_path(question, answer):
            raise ValueError(f"{string!r} is not a solved example of {language.name}")
        questions.append(question)
        truths.append(solve(edges, start, goal))
        shortcut.append(shortcut_answer(edges, start, rng)[1] == truths[-1][1])
    if objective == "ar":
        answers = ar_answers(model, tokenizer, language, questions, batch_size=batch_size)
    else:
        answers = mdm_answers(
            model,
            tokenizer,
            language,
            strings,
            seq_len,
            steps=steps,
            strategy=strategy,
            batch_size=batch_size,
            seed=seed,
        )
    exact = [a == t for a, t in zip(answers, truths)]
    first = [a[1:2] == t[1] for a, t in zip(answers, truths)]
    nodes = [np.mean([x == y for x, y in zip(a, t)]) for a, t in zip(answers, truths)]
    return {
        "objective": objective,
        "n": len(strings),
        "exact_match": float(np.mean(exact)),
        "first_step": float(np.mean(first)),
        "node_accuracy": float(np.mean(nodes)),
        "chance_first_step": 1.0 / language.degree,
        "shortcut_first_step": float(np.mean(shortcut)),
        "decoding": (
            "greedy AR after [BOS] + prompt"
            if objective == "ar"
            else f"MDM FixedCount(steps={steps or language.arm + 1}, remasking={strategy!r}), "
            "argmax tokens, answer masked in the padded training row"
        ),
        "answers": answers,
        "exact_match_per_example": exact,
        "first_step_per_example": first,
    }
