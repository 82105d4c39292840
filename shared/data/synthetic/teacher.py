"""Fixed-length strings from a small random causal ``Transformer``: probabilities by the chain
rule of the teacher's own conditionals."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from shared.config import ModelConfig
from shared.data.synthetic.base import LETTERS, Language, _check_int, derive_seed
from shared.model import Transformer


class TeacherLanguage(Language):
    """Strings of exactly ``length`` symbols from a fixed random causal Transformer.

    Weights are N(0, 1/fan_in) (embeddings N(0, 1)) from ``seed``, much larger than training
    init so the teacher's conditionals depend on the context; logits are multiplied by
    ``sharpness`` (higher = lower entropy). Token ids: symbols 0..vocab-1, BOS = vocab.
    """

    def __init__(
        self,
        *,
        vocab: int = 6,
        length: int = 16,
        dim: int = 32,
        layers: int = 2,
        sharpness: float = 1.0,
        seed: int = 0,
    ) -> None:
        _check_int("vocab", vocab, 2, len(LETTERS))
        _check_int("length", length, 1, 1024)
        _check_int("dim", dim, 4, 1024)
        _check_int("layers", layers, 1, 16)
        if not sharpness > 0:
            raise ValueError(f"sharpness={sharpness} must be > 0")
        cfg = ModelConfig(
            vocab_size=vocab + 1,
            dim=dim,
            n_layers=layers,
            n_heads=2 if dim % 2 == 0 else 1,
            n_kv_heads=2 if dim % 2 == 0 else 1,
            hidden_dim=2 * dim,
            max_seq_len=length + 1,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, 0))
            model = Transformer(cfg)
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith("norm.weight"):
                        continue
                    std = 1.0 if "embeddings" in name else 1.0 / math.sqrt(param.shape[-1])
                    param.normal_(0.0, std)
        self.model = model.double().eval()
        self.vocab = vocab
        self.bos = vocab
        self.sharpness = float(sharpness)
        self.alphabet = LETTERS[:vocab]
        self.max_len = length
        self.name = (
            f"teacher(vocab={vocab}, length={length}, dim={dim}, layers={layers}, seed={seed})"
        )

    def _outside_support(self, string: str) -> bool:
        return len(string) != self.max_len or any(c not in self.alphabet for c in string)

    @torch.no_grad()
    def _log_conditionals(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, T, vocab] log P(symbol at t + 1 | BOS + ids[:, :t]) for prefixes ids [B, T - 1]."""
        tokens = torch.cat([torch.full((len(ids), 1), self.bos, dtype=torch.long), ids], 1)
        logits = self.model(tokens, attention="causal")[..., : self.vocab]
        return torch.log_softmax(self.sharpness * logits, dim=-1)

    def next_log_probs(self, prefix: str) -> np.ndarray:
        if len(prefix) > self.max_len:
            raise ValueError(f"prefix of length {len(prefix)} exceeds length={self.max_len}")
        out = np.full(self.vocab + 1, -math.inf)
        if len(prefix) == self.max_len:
            out[-1] = 0.0
            return out
        ids = torch.tensor([[self.symbol_index(c) for c in prefix]], dtype=torch.long)
        out[:-1] = self._log_conditionals(ids)[0, -1].numpy()
        return out

    def log_probs(self, strings: Sequence[str], batch_size: int = 2048) -> np.ndarray:
        out = np.full(len(strings), -math.inf)
        ok = [i for i, s in enumerate(strings) if not self._outside_support(s)]
        for start in range(0, len(ok), batch_size):
            chunk = ok[start : start + batch_size]
            ids = torch.tensor([[self.alphabet.index(c) for c in strings[i]] for i in chunk])
            logp = self._log_conditionals(ids[:, :-1]).gather(2, ids[..., None])[..., 0]
            out[chunk] = logp.sum(1).numpy()
        return out

    def log_prob(self, string: str) -> float:
        return float(self.log_probs([string])[0])

    @torch.no_grad()
    def sample(self, n: int, seed: int, batch_size: int = 4096) -> list[str]:
        _check_int("n", n, 0, 10**9)
        generator = torch.Generator().manual_seed(seed)
        letters = np.array(list(self.alphabet))
        strings: list[str] = []
        for start in range(0, n, batch_size):
            ids = torch.zeros((min(batch_size, n - start), 0), dtype=torch.long)
            for _ in range(self.max_len):
                probs = self._log_conditionals(ids)[:, -1].exp()
                ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], 1)
            strings += ["".join(letters[row]) for row in ids.numpy()]
        return strings

    def expected_length(self) -> float:
        return float(self.max_len)

    def support_size_bound(self) -> int:
        return self.vocab**self.max_len

    def enumerate(self) -> Iterator[tuple[str, float]]:
        strings = ["".join(t) for t in itertools.product(self.alphabet, repeat=self.max_len)]
        yield from zip(strings, self.log_probs(strings).tolist())
