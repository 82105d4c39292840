"""The path-star planning task: generator, exact solver and checker, shortcut baseline, exact
probabilities, spec, and the model probe (tiny models and solver stand-ins)."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from eval.synthetic.likelihood import MASKED_LOGIT, symbol_ids
from eval.synthetic.pathstar_probe import decoding_steps, path_scores, pathstar_probe
from eval.synthetic.report import synthetic_report
from shared.checkpoint import full_model_state, save_checkpoint
from shared.config import ModelConfig
from shared.data.corpus import load_corpus
from shared.data.synthetic.pathstar import (
    PathStarLanguage,
    check_path,
    parse_example,
    prompt_and_answer,
    shortcut_answer,
    solve,
)
from shared.data.synthetic.specs import build_language, parse_spec
from shared.model import Transformer
from shared.tokenizer import Tokenizer

DOC_EXAMPLE = "xm,kq,qb,kx/km=kxm"


def test_format_and_determinism() -> None:
    language = PathStarLanguage(degree=3, arm=4)
    assert language.max_len == 44 and language.expected_length() == 44.0
    assert set(language.alphabet) == set("abcdefghijklmnopqrstuvwxyz,/=")
    strings = language.sample(200, seed=0)
    assert strings == language.sample(200, seed=0) and strings != language.sample(200, seed=1)
    for s in strings:
        assert len(s) == language.max_len and set(s) <= set(language.alphabet)
        edges, start, goal, path = parse_example(s)
        assert len(edges) == 12 and len(path) == 5 and path[0] == start and path[-1] == goal
        labels = {x for e in edges for x in e}
        assert len(labels) == 13 and len(set(edges)) == 12
        prompt, answer = prompt_and_answer(s)
        assert prompt + answer == s and prompt.endswith("=") and answer == path
        assert s[35] == "/" and s[38] == "=" and s.count(",") == 11
    # the docstring's example is a string of the degree-2, arm-2 language
    small = PathStarLanguage(degree=2, arm=2)
    assert small.is_valid(DOC_EXAMPLE) and solve(*parse_example(DOC_EXAMPLE)[:3]) == "kxm"


def test_solver_and_checker_are_exact() -> None:
    rng = np.random.default_rng(0)
    for degree, arm in [(2, 1), (2, 5), (3, 4), (5, 3), (8, 2)]:
        language = PathStarLanguage(degree=degree, arm=arm, symbols=62)
        for s in language.sample(300, seed=degree * 10 + arm):
            edges, start, goal, path = parse_example(s)
            prompt, answer = prompt_and_answer(s)
            assert solve(edges, start, goal) == path
            assert check_path(prompt, answer) and check_path(prompt[:-1], answer)
            wrong_arm = shortcut_answer([e for e in edges if e != (start, path[1])], start, rng)
            assert not check_path(prompt, wrong_arm)
            assert not check_path(prompt, path[:-1]) and not check_path(prompt, path[::-1])
            assert not check_path(prompt, "") and not check_path(prompt, path + "a")
            assert language.is_valid(s) and not language.is_valid(prompt + wrong_arm)
    with pytest.raises(ValueError, match="malformed"):
        check_path("ab,bc=", "abc")
    with pytest.raises(ValueError, match="not reachable"):
        solve([("a", "b")], "b", "a")


def test_shortcut_baseline_is_at_chance() -> None:
    degree, draws = 3, 4000
    language = PathStarLanguage(degree=degree, arm=4)
    rng = np.random.default_rng(1)
    first, exact = [], []
    for s in language.sample(draws, seed=2):
        edges, start, _, path = parse_example(s)
        guess = shortcut_answer(edges, start, rng)
        assert len(guess) == len(path) and guess[0] == start
        first.append(guess[1] == path[1])
        exact.append(guess == path)
    assert first == exact  # the shortcut is right exactly when its first pick is
    p = 1 / degree
    sigma = math.sqrt(p * (1 - p) / draws)
    assert abs(np.mean(first) - p) < 4 * sigma


@pytest.mark.parametrize(
    ("degree", "arm", "symbols", "reverse"), [(3, 1, 5, 0), (2, 2, 5, 0), (2, 2, 5, 1)]
)
def test_exact_probabilities_by_enumeration(degree, arm, symbols, reverse) -> None:
    language = PathStarLanguage(degree=degree, arm=arm, symbols=symbols, reverse=reverse)
    strings = dict(language.enumerate())  # depth-first over the exact next_log_probs
    assert len(strings) == language.support_size_bound()
    assert sum(math.exp(lp) for lp in strings.values()) == pytest.approx(1.0, abs=1e-9)
    entropy = language.entropy()
    assert entropy.exact and entropy.nats_per_string == pytest.approx(math.log(len(strings)))
    for s, lp in strings.items():
        assert lp == pytest.approx(-entropy.nats_per_string, abs=1e-9)
        assert language.log_prob(s) == pytest.approx(lp, abs=1e-9)
    samples = Counter(language.sample(3000, seed=5))
    assert set(samples) <= set(strings)
    if len(strings) <= 400:  # sampled frequencies are uniform over the support
        counts = [samples[s] for s in strings]
        assert stats.chisquare(counts).pvalue > 1e-3


def test_graph_counts_match_brute_force_and_chain_rule() -> None:
    language = PathStarLanguage(degree=2, arm=3, symbols=7)
    graphs = [
        frozenset((perm[p], perm[c]) for p, c in zip(language._parent, language._child))
        for perm in itertools.permutations(language.labels, language.nodes)
    ]
    rng = np.random.default_rng(3)
    for _ in range(60):
        edges = list(graphs[int(rng.integers(len(graphs)))])
        rng.shuffle(edges)
        edges = edges[: int(rng.integers(0, len(edges) + 1))]
        if rng.random() < 0.3:  # an edge that may break the star
            edges.append(tuple(str(x) for x in rng.choice(list(language.labels), 2)))
        brute = sum(set(edges) <= g for g in graphs) if len(set(edges)) == len(edges) else 0
        assert language._graphs_with(edges) == brute
    default = PathStarLanguage()
    for s in default.sample(3, seed=7):
        chain = sum(
            default.next_log_probs(s[:t])[default.alphabet.index(s[t])] for t in range(len(s))
        )
        chain += default.next_log_probs(s)[-1]
        assert chain == pytest.approx(default.log_prob(s), abs=1e-9)
    with pytest.raises(ValueError, match="probability zero"):
        default.next_log_probs("ab,ba")


def test_spec_and_corpus(byte_tok) -> None:
    spec = "synthetic:pathstar?degree=2&arm=3&symbols=30&n=50&n_val=7&seed=4"
    kind, kwargs, corpus = parse_spec(spec)
    assert kind == "pathstar" and kwargs == {"degree": 2, "arm": 3, "symbols": 30, "seed": 4}
    assert corpus == {"n": 50, "n_val": 7}
    language = build_language(spec)
    assert isinstance(language, PathStarLanguage) and language.max_len == 25
    splits = load_corpus(spec)
    assert len(splits.train) == 50 and len(splits.validation) == 7
    assert all(language.is_valid(s) for s in splits.train + splits.validation)
    assert splits.train == load_corpus(spec).train
    assert all(len(byte_tok.encode(s)) == len(s) for s in splits.train)
    with pytest.raises(ValueError, match=r"degree=1 must be an integer in \[2"):
        build_language("synthetic:pathstar?degree=1")
    with pytest.raises(ValueError, match="symbols=10 is too few.*13 nodes"):
        build_language("synthetic:pathstar?degree=3&arm=4&symbols=10")
    with pytest.raises(ValueError, match="symbols=63 must be"):
        build_language("synthetic:pathstar?symbols=63")
    with pytest.raises(ValueError, match="unknown key 'depth'"):
        parse_spec("synthetic:pathstar?depth=3")
    with pytest.raises(ValueError, match="pathstar"):
        parse_spec("synthetic:nope")


def _tiny(byte_tok: Tokenizer, objective: str, seq_len: int) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=byte_tok.vocab_size + (objective == "mdm"),
        dim=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=2,
        hidden_dim=32,
        max_seq_len=seq_len,
    )
    return Transformer(cfg)


def test_probe_runs_on_tiny_models(byte_tok) -> None:
    language = PathStarLanguage(degree=2, arm=2)
    examples = language.sample(12, seed=9)
    seq_len = language.max_len + 2
    for objective in ("ar", "mdm"):
        model = _tiny(byte_tok, objective, seq_len)
        out = pathstar_probe(model, byte_tok, language, objective, seq_len, examples, batch_size=5)
        assert out["n"] == 12 and out["chance_first_step"] == 0.5
        for key in ("exact_match", "first_step", "node_accuracy", "shortcut_first_step"):
            assert 0.0 <= out[key] <= 1.0
        assert len(out["answers"]) == len(out["exact_match_per_example"]) == 12
        assert all(len(a) == 3 for a in out["answers"])
        assert out["exact_match"] <= out["first_step"]
    with pytest.raises(ValueError, match="objective"):
        pathstar_probe(_tiny(byte_tok, "ar", seq_len), byte_tok, language, "bd", seq_len, examples)
    with pytest.raises(ValueError, match="seq_len"):
        pathstar_probe(
            _tiny(byte_tok, "ar", seq_len), byte_tok, language, "ar", seq_len - 1, examples
        )


def test_path_scores_by_hand() -> None:
    # one exact answer, a wrong last node, a wrong start and last node, an unknown token ("?")
    means, per_example = path_scores(["abc", "abd", "xbd", "a?c"], ["abc"] * 4, 3)
    assert means == {
        "exact_match": 0.25,
        "first_step": 0.75,
        "node_accuracy": pytest.approx((3 + 2 + 1 + 2) / 12),
        "position_accuracy": [0.75, 0.75, 0.5],
    }
    assert per_example == {
        "exact_match_per_example": [True, False, False, False],
        "first_step_per_example": [True, True, True, False],
    }


class SolverModel(nn.Module):
    """A stand-in that reads the prompt from each row and puts its logits on the path: the exact
    solver (``shortcut=False``), or the Clever-Hans shortcut (the first-listed child of the
    start, then unique children). Bidirectional calls fill the masked answer (MDM)."""

    def __init__(self, language, byte_tok, shortcut: bool = False, mdm: bool = False) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        vocab = byte_tok.vocab_size + mdm
        self.config = type("Config", (), {"vocab_size": vocab, "max_seq_len": 64})()
        self.ids = dict(zip(language.alphabet, symbol_ids(language, byte_tok)))
        self.symbol_of = {i: s for s, i in self.ids.items()}
        self.language, self.shortcut = language, shortcut

    def path(self, prompt: str) -> str:
        edges, start, goal = parse_example(prompt + "x")[:3]
        if self.shortcut:
            return shortcut_answer(edges, start, _FirstChoice())
        return self.language.answer(edges, start, goal)

    def forward(self, tokens, attention="causal", output_mask=None, positions=None, **_):
        vocab = self.config.vocab_size
        out = torch.full((*tokens.shape, vocab), MASKED_LOGIT)
        begin = self.language.max_len - self.language.arm  # BOS + prompt
        for r, row in enumerate(tokens.tolist()):
            if len(row) < begin:
                continue
            path = self.path("".join(self.symbol_of[t] for t in row[1:begin]))
            for j, node in enumerate(path):
                at = begin - 1 + j if attention == "causal" else begin + j
                if at < len(row):
                    out[r, at, self.ids[node]] = 10.0
        return out if output_mask is None else out[output_mask]


class _FirstChoice:
    def integers(self, high: int) -> int:
        return 0


def test_probe_scores_oracles_and_the_shortcut(byte_tok) -> None:
    language = PathStarLanguage(degree=2, arm=3)
    examples = language.sample(400, seed=11)
    seq_len = language.max_len + 2
    for objective in ("ar", "mdm"):
        oracle = SolverModel(language, byte_tok, mdm=objective == "mdm")
        out = pathstar_probe(oracle, byte_tok, language, objective, seq_len, examples[:40])
        assert out["exact_match"] == out["first_step"] == out["node_accuracy"] == 1.0
        assert out["lookup_accuracy"] == 1.0
    shortcut = SolverModel(language, byte_tok, shortcut=True)
    out = pathstar_probe(shortcut, byte_tok, language, "ar", seq_len, examples)
    assert out["exact_match_per_example"] == out["first_step_per_example"]
    assert abs(out["first_step"] - 0.5) < 4 * math.sqrt(0.25 / len(examples))


def test_reversed_answers_and_the_decoding_order(byte_tok) -> None:
    forward = PathStarLanguage(degree=2, arm=3)
    backward = PathStarLanguage(degree=2, arm=3, reverse=1)
    # the same graphs and goals, the answer written from the goal back to the start
    for f, b in zip(forward.sample(20, seed=4), backward.sample(20, seed=4)):
        (head, path), (head_b, path_b) = prompt_and_answer(f), prompt_and_answer(b)
        assert head == head_b and path_b == path[::-1]
        assert backward.log_prob(b) == forward.log_prob(f) > -math.inf
        assert backward.log_prob(f) == -math.inf
    assert build_language("synthetic:pathstar?degree=2&arm=3&reverse=1").reverse
    with pytest.raises(ValueError, match="reverse"):
        PathStarLanguage(degree=2, arm=3, reverse=2)
    examples = backward.sample(30, seed=2)
    seq_len = backward.max_len + 2
    for objective in ("ar", "mdm"):
        oracle = SolverModel(backward, byte_tok, mdm=objective == "mdm")
        out = pathstar_probe(oracle, byte_tok, backward, objective, seq_len, examples, batch_size=7)
        assert out["exact_match"] == 1.0 and out["position_accuracy"] == [1.0] * 4
        assert out["lookup_accuracy"] == 1.0
    # the oracle is equally sure everywhere: ties go leftmost, one position per step
    assert out["decoding_step"] == [0.0, 1.0, 2.0, 3.0]
    reveals = [torch.tensor([[False, True], [True, False]]), torch.tensor([[True, True]] * 2)]
    assert decoding_steps(reveals).tolist() == [[1, 0], [0, 1]]


def test_synthetic_report_includes_the_probe(byte_tok, tmp_path) -> None:
    spec = "synthetic:pathstar?degree=2&arm=2&seed=1"
    seq_len = build_language(spec).max_len + 2
    paths = {}
    for objective in ("ar", "mdm"):
        model = _tiny(byte_tok, objective, seq_len)
        state = {
            "objective": objective,
            "model_config": model.config.to_dict(),
            "train_config": {
                "seq_len": seq_len,
                "protocol": "padded",
                "schedule": "linear",
                "t_eps": 1e-3,
                "estimator": "time",
            },
        }
        paths[objective] = save_checkpoint(
            tmp_path / objective,
            0,
            weights=full_model_state(model),
            tokenizer=byte_tok,
            state=state,
        )
    report = synthetic_report(
        paths["ar"], paths["mdm"], spec, 8, n_heldout=20, nelbo_samples=2, infill_tasks_max=10
    )
    assert report["language"]["entropy"]["exact"]
    for label in ("ar", "mdm"):
        assert report[label]["pathstar"]["n"] == 10
        assert math.isfinite(report[label]["likelihood"]["gap_to_true_nll"])
