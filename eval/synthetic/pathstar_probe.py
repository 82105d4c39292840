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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from arlm.generate import ARGenerator, GenerationConfig
from dllm.canvas import Canvas, mask_token_id
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import FixedCount
from eval.synthetic.likelihood import language_rows, model_device, symbol_ids
from shared.data.synthetic.pathstar import (
    PathStarLanguage,
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


@dataclass(frozen=True)
class RecordedFixedCount(FixedCount):
    """``FixedCount`` that also keeps each step's reveal mask ([B, region] per step), so the
    report can show the order in which the MDM decoded the answer."""

    reveals: list = field(default_factory=list, compare=False, hash=False, repr=False)

    def step(self, ctx):
        reveal, tokens = super().step(ctx)
        self.reveals.append(reveal.cpu())
        return reveal, tokens


def decoding_steps(reveals: list[torch.Tensor]) -> torch.Tensor:
    """[B, region] the step (0-based) at which each position was revealed (-1: never)."""
    order = torch.full_like(reveals[0], -1, dtype=torch.long)
    for step, reveal in enumerate(reveals):
        order[reveal & (order < 0)] = step
    return order


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
    order: list | None = None,
) -> list[str]:
    """MDM answers: the answer positions of each padded row masked and filled greedily in
    ``steps`` steps (default: one position per step) under the ``strategy`` remasking rule.
    ``order``, when given, receives per example the step at which each answer position was
    decoded."""
    length = language.arm + 1
    generator = DiffusionGenerator(model, tokenizer)
    begin_answer = 1 + language.max_len - length  # BOS, then the prompt
    out: list[str] = []
    for begin in range(0, len(strings), batch_size):
        rule = RecordedFixedCount(steps=steps or length, remasking=strategy)
        config = SamplerConfig(rule, sampling=SamplingConfig(temperature=0))
        chunk = strings[begin : begin + batch_size]
        rows = torch.as_tensor(language_rows(chunk, tokenizer, seq_len, language), dtype=torch.long)
        rows[:, begin_answer : begin_answer + length] = generator.mask_id
        canvas = Canvas(rows, generator.mask_id)
        filled = generator.fill(canvas, config, seed=seed + begin, eos="none").raw.tokens
        out += _texts(tokenizer, language, filled[:, begin_answer : begin_answer + length].tolist())
        if order is not None:
            order += decoding_steps(rule.reveals).tolist()
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
    the Clever-Hans shortcut (``shortcut_first_step``, a random child of the start);
    ``position_accuracy`` per answer position, the MDM's mean ``decoding_step`` per position,
    and ``lookup_accuracy`` (``one_hop_lookups``): whether the model learned the edge lookups
    at all, apart from planning.
    """
    if objective not in ("ar", "mdm"):
        raise ValueError(f"objective={objective!r}; valid: 'ar', 'mdm'")
    if not prompts:
        raise ValueError("prompts is empty: give held-out examples, e.g. language.sample(n, seed)")
    strings = list(prompts)
    language_rows(strings, tokenizer, seq_len, language)  # checks lengths and one token per symbol
    truths, shortcut = solved_examples(language, strings, seed)
    probed = Probed(model, tokenizer, language, objective, seq_len, strings)
    answers, order, decoding = model_answers(probed, steps, strategy, batch_size, seed)
    means, per_example = path_scores(answers, truths, language.arm + 1)
    return {
        "objective": objective,
        "n": len(strings),
        **means,
        "lookup_accuracy": one_hop_lookups(probed, batch_size),
        # the mean step (0 = first) at which each answer position was decoded (MDM only)
        "decoding_step": np.mean(order, axis=0).tolist() if order else None,
        "chance_first_step": 1.0 / language.degree,
        "shortcut_first_step": float(np.mean(shortcut)),
        "decoding": decoding,
        "answers": answers,
        **per_example,
    }


def solved_examples(
    language: PathStarLanguage, strings: Sequence[str], seed: int
) -> tuple[list[str], list[bool]]:
    """Each example's answer, checked against the solver, and whether the Clever-Hans shortcut,
    a random child of the start drawn from ``seed``, gets the example's first step right."""
    truths, rng, shortcut = [], np.random.default_rng(seed), []
    for string in strings:
        answer = prompt_and_answer(string)[1]
        edges, start, goal, _ = parse_example(string)
        if len(string) != language.max_len or answer != language.answer(edges, start, goal):
            raise ValueError(f"{string!r} is not a solved example of {language.name}")
        truths.append(answer)
        shortcut.append(shortcut_answer(edges, start, rng)[1] == solve(edges, start, goal)[1])
    return truths, shortcut


@dataclass(frozen=True)
class Probed:
    """A model under the probe and what it is probed on: its tokenizer, the language, its
    objective ("ar" or "mdm"), its training row length and the examples."""

    model: nn.Module
    tokenizer: Tokenizer
    language: PathStarLanguage
    objective: str
    seq_len: int
    strings: Sequence[str]


def model_answers(
    probed: Probed, steps: int | None, strategy: str, batch_size: int, seed: int
) -> tuple[list[str], list, str]:
    """The model's answer to each example, the step at which each answer position was decoded
    (MDM; empty for the AR), and how the answers were decoded."""
    model, tokenizer, language = probed.model, probed.tokenizer, probed.language
    objective, seq_len, strings = probed.objective, probed.seq_len, probed.strings
    if objective == "ar":
        questions = [prompt_and_answer(string)[0] for string in strings]
        answers = ar_answers(model, tokenizer, language, questions, batch_size=batch_size)
        return answers, [], "greedy AR after [BOS] + prompt"
    order: list = []
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
        order=order,
    )
    decoding = (
        f"MDM FixedCount(steps={steps or language.arm + 1}, remasking={strategy!r}), "
        "argmax tokens, answer masked in the padded training row"
    )
    return answers, order, decoding


def path_scores(
    answers: Sequence[str], truths: Sequence[str], length: int
) -> tuple[dict[str, Any], dict[str, list[bool]]]:
    """Means over the examples: ``exact_match`` (the whole path), ``first_step`` (the node
    after the start), ``node_accuracy`` (each example's fraction of path nodes right, by
    position) and ``position_accuracy`` per answer position (``length`` of them); and the
    per-example exact and first-step hits."""
    exact = [a == t for a, t in zip(answers, truths)]
    first = [a[1:2] == t[1] for a, t in zip(answers, truths)]
    nodes = [np.mean([x == y for x, y in zip(a, t)]) for a, t in zip(answers, truths)]
    positions = [
        float(np.mean([a[i : i + 1] == t[i] for a, t in zip(answers, truths)]))
        for i in range(length)
    ]
    means = {
        "exact_match": float(np.mean(exact)),
        "first_step": float(np.mean(first)),
        "node_accuracy": float(np.mean(nodes)),
        "position_accuracy": positions,
    }
    return means, {"exact_match_per_example": exact, "first_step_per_example": first}


@torch.no_grad()
def one_hop_lookups(probed: Probed, batch_size: int = 256) -> float:
    """The accuracy of the answer's one-edge lookups, with the true answer around them: the AR
    teacher-forced at the answer positions after the first step (each is the unique neighbour of
    the node before it: what the Clever-Hans shortcut learns), the MDM filling each answer
    position after the first alone with every other position visible. A model below ~0.9 has not
    learned to read the edge list, so its planning result says nothing."""
    model, tokenizer, language = probed.model, probed.tokenizer, probed.language
    objective, seq_len, strings = probed.objective, probed.seq_len, probed.strings
    length = language.arm + 1
    begin = 1 + language.max_len - length  # the first answer position of a row
    ids = torch.tensor(symbol_ids(language, tokenizer))
    device = model_device(model)
    hits, total = 0, 0
    for first in range(0, len(strings), batch_size):
        rows = torch.as_tensor(
            language_rows(strings[first : first + batch_size], tokenizer, seq_len, language),
            dtype=torch.long,
        )
        for k in range(2, length):  # the positions after the first step
            target = rows[:, begin + k]
            if objective == "ar":
                logits = model(rows.to(device), attention="causal")[:, begin + k - 1]
            else:
                query = rows.clone()
                query[:, begin + k] = mask_token_id(model, tokenizer)
                logits = model(query.to(device), attention="bidirectional")[:, begin + k]
            guess = ids[logits[:, ids].argmax(-1).cpu()]
            hits += int((guess == target).sum())
            total += len(target)
    return hits / total
