"""The path-star planning task (Bachmann & Nagarajan 2024, "The Pitfalls of Next-Token
Prediction"): find the path from the centre of a star graph to the end of one of its arms.

A teacher-forced AR model can learn the Clever-Hans shortcut (each next node is the unique child
of the previous one) and then guesses the arm at the start, near 1/degree; a masked-diffusion
model can decode the path from the goal end, where every node has a unique parent. ``solve`` is
the exact solver, ``check_path`` the exact checker, ``shortcut_answer`` the shortcut baseline;
``eval.synthetic.pathstar_probe`` asks a model for the answers.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from shared.data.synthetic.base import (
    LETTERS,
    MC_ENTROPY_SAMPLES,
    EntropyValue,
    Language,
    _check_int,
)

LABELS = LETTERS + LETTERS.upper() + "0123456789"  # the node-label pool, its first ``symbols``
EDGE_SEP, PROMPT_SEP, ANSWER_SEP = ",", "/", "="

Edge = tuple[str, str]


# ---- pure functions of one example --------------------------------------------------------------


def prompt_and_answer(string: str) -> tuple[str, str]:
    """Split an example at its ``=``: (prompt up to and including ``=``, answer path)."""
    head, sep, answer = string.partition(ANSWER_SEP)
    if not sep:
        raise ValueError(f"{string!r} has no {ANSWER_SEP!r}: not a path-star example")
    return head + sep, answer


def _parse_prompt(prompt: str) -> tuple[list[Edge], str, str]:
    body = prompt[:-1] if prompt.endswith(ANSWER_SEP) else prompt
    edge_text, sep, query = body.partition(PROMPT_SEP)
    edges = [(e[0], e[1]) for e in edge_text.split(EDGE_SEP) if len(e) == 2]
    if not sep or len(query) != 2 or len(edges) != edge_text.count(EDGE_SEP) + 1:
        raise ValueError(
            f"prompt {prompt!r} is malformed: expected 'pc,pc,...{PROMPT_SEP}SG{ANSWER_SEP}' "
            "(two-character parent-child edges, then the start S and the goal G)"
        )
    return edges, query[0], query[1]


def parse_example(string: str) -> tuple[list[Edge], str, str, str]:
    """``(edges, start, goal, path)`` of an example string (edges in their shuffled order)."""
    prompt, path = prompt_and_answer(string)
    edges, start, goal = _parse_prompt(prompt)
    return edges, start, goal, path


def solve(edges: list[Edge], start: str, goal: str) -> str:
    """The exact path start -> ... -> goal: walk back from the goal through unique parents."""
    parent: dict[str, str] = {}
    for p, c in edges:
        if parent.setdefault(c, p) != p:
            raise ValueError(f"node {c!r} has two parents ({parent[c]!r}, {p!r}): not a tree")
    path = [goal]
    while path[-1] != start:
        if path[-1] not in parent or len(path) > len(edges):
            raise ValueError(f"goal {goal!r} is not reachable from start {start!r}")
        path.append(parent[path[-1]])
    return "".join(reversed(path))


def check_path(prompt: str, answer: str) -> bool:
    """Exact checker: ``answer`` walks from the prompt's start to its goal along its edges (the
    path in a tree is unique, so this equals ``answer == solve(...)``). ``prompt`` may end with
    ``=``; a malformed prompt raises ValueError."""
    edges, start, goal = _parse_prompt(prompt)
    edge_set = set(edges)
    return (
        len(answer) >= 1
        and answer[0] == start
        and answer[-1] == goal
        and all((a, b) in edge_set for a, b in zip(answer, answer[1:]))
    )


def shortcut_answer(edges: list[Edge], start: str, rng: np.random.Generator) -> str:
    """The Clever-Hans baseline: a uniformly random child of the start, then the unique child of
    each node until a leaf. Right exactly when the first pick is (chance 1/degree)."""
    children: dict[str, list[str]] = {}
    for p, c in edges:
        children.setdefault(p, []).append(c)
    first = children.get(start, [])
    if not first:
        raise ValueError(f"start {start!r} has no child in the edge list")
    path = [start, first[int(rng.integers(len(first)))]]
    while path[-1] in children and len(path) <= len(edges):
        path.append(children[path[-1]][0])
    return "".join(path)


# ---- counting star graphs that contain given edges (exact conditionals) -------------------------


def _falling(n: int, k: int) -> int:
    return math.perm(n, k) if 0 <= k <= n else 0


@lru_cache(maxsize=65536)
def _placements(slots: tuple[int, ...], chains: tuple[int, ...]) -> int:
    """Ways to lay distinguishable chains (node counts ``chains``, sorted) into the arm slots
    (free positions per arm), without overlap; the positions left over are filled later."""
    if not slots:
        return int(not chains)
    return _fill(slots[0], slots[1:], chains)


@lru_cache(maxsize=65536)
def _fill(free: int, rest: tuple[int, ...], chains: tuple[int, ...]) -> int:
    if free == 0:
        return _placements(rest, chains)
    total = _fill(free - 1, rest, chains)  # the next position holds an unseen label
    for m in sorted(set(chains)):
        if m <= free:
            others = list(chains)
            others.remove(m)
            total += chains.count(m) * _fill(free - m, rest, tuple(others))
    return total


def _structure(edges: list[Edge], degree: int) -> tuple[tuple[int, ...] | None, tuple, int] | None:
    """(arm prefixes below a known centre or None, free chains' node counts, nodes seen), or None
    when no star graph holds these edges."""
    parent: dict[str, str] = {}
    children: dict[str, list[str]] = {}
    for p, c in edges:
        if p == c or c in parent:
            return None
        parent[c] = p
        children.setdefault(p, []).append(c)
    nodes = set(parent) | set(children)
    branching = [v for v, cs in children.items() if len(cs) > 1]
    if len(branching) > 1 or any(b in parent or len(children[b]) > degree for b in branching):
        return None

    def chain(v: str) -> int:  # nodes from v down to the end of its chain
        count = 1
        while v in children and count <= len(nodes):
            v, count = children[v][0], count + 1
        return count

    arms: tuple[int, ...] | None = None
    chains, seen = [], 0
    for root in (v for v in nodes if v not in parent):
        if branching and root == branching[0]:
            arms = tuple(sorted(chain(c) for c in children[root]))
            seen += 1 + sum(arms)
        else:
            chains.append(chain(root))
            seen += chains[-1]
    return (arms, tuple(sorted(chains)), len(nodes)) if seen == len(nodes) else None  # cycles


# ---- the language -------------------------------------------------------------------------------


class PathStarLanguage(Language):
    """Path-star graphs: a centre and ``degree`` arms of ``arm`` nodes each, ``1 + degree*arm``
    distinct node labels drawn per string from the first ``symbols`` of ``LABELS`` (a-z, A-Z,
    0-9). A string is the edge list (``parent child`` pairs joined by ``,``, in a uniformly
    shuffled order), ``/``, the start (the centre) and the goal (the end of a uniformly chosen
    arm), ``=``, then the path from start to goal (``arm + 1`` labels). With degree 2, arm 2::

        xm,kq,qb,kx/km=kxm        (arms k-q-b and k-x-m, goal m)

    Every string has ``3*degree*arm + arm + 4`` symbols (single characters: one byte token each).
    With ``reverse=1`` the answer is written from the goal back to the start (``...=mxk`` above):
    each next node is the unique parent of the last, so left-to-right prediction needs no
    planning (the positive control of the path-star finding).

    Every valid string is equally likely, so ``log_prob`` and the entropy are closed-form;
    ``next_log_probs`` is exact too, by counting the star graphs that contain the edges seen so
    far (``_structure``, ``_placements``). ``seed`` is accepted for the spec interface: the
    language has no random parameters (the corpus draws depend on it through ``specs``).
    """

    def __init__(
        self, *, degree: int = 3, arm: int = 4, symbols: int = 26, reverse: int = 0, seed: int = 0
    ) -> None:
        _check_int("degree", degree, 2, len(LABELS))
        _check_int("reverse", reverse, 0, 1)
        _check_int("arm", arm, 1, len(LABELS))
        nodes = 1 + degree * arm
        if isinstance(symbols, bool) or not isinstance(symbols, int) or symbols > len(LABELS):
            raise ValueError(f"symbols={symbols!r} must be an integer <= {len(LABELS)}")
        if symbols < nodes:
            raise ValueError(
                f"symbols={symbols} is too few for degree={degree}, arm={arm}: the graph has "
                f"1 + degree*arm = {nodes} nodes, each with a distinct label; use symbols >= "
                f"{nodes} (at most {len(LABELS)})"
            )
        self.degree, self.arm, self.symbols, self.nodes = degree, arm, symbols, nodes
        self.n_edges = degree * arm
        self.labels = LABELS[:symbols]
        self.alphabet = self.labels + EDGE_SEP + PROMPT_SEP + ANSWER_SEP
        self.max_len = 3 * self.n_edges + arm + 4
        self.reverse = bool(reverse)
        self.name = f"pathstar(degree={degree}, arm={arm}, symbols={symbols})" + (
            " reversed" if reverse else ""
        )
        # node k's parent: arm j holds nodes 1 + j*arm ... (j+1)*arm, node 0 is the centre
        child = np.arange(1, nodes)
        self._parent = np.where((child - 1) % arm == 0, 0, child - 1)
        self._child = child

    # ---- sizes

    def support_size_bound(self) -> int:
        """Exactly the number of strings: labelled graphs (arms unordered) x edge orders x goals."""
        graphs = _falling(self.symbols, self.nodes) // math.factorial(self.degree)
        return graphs * math.factorial(self.n_edges) * self.degree

    def _log_support(self) -> float:
        return (
            math.lgamma(self.symbols + 1)
            - math.lgamma(self.symbols - self.nodes + 1)
            - math.lgamma(self.degree + 1)
            + math.lgamma(self.n_edges + 1)
            + math.log(self.degree)
        )

    def expected_length(self) -> float:
        return float(self.max_len)

    def entropy(self, mc_samples: int = MC_ENTROPY_SAMPLES, seed: int = 0) -> EntropyValue:
        return EntropyValue(
            self._log_support(),
            0.0,
            f"exact: uniform over {self.support_size_bound()} strings",
            self.expected_length(),
        )

    # ---- sampling

    def sample(self, n: int, seed: int) -> list[str]:
        _check_int("n", n, 0, 10**9)
        rng = np.random.default_rng(seed)
        labels = np.argsort(rng.random((n, self.symbols)), axis=1)[:, : self.nodes]
        order = np.argsort(rng.random((n, self.n_edges)), axis=1)
        goals = rng.integers(0, self.degree, size=n)
        names = np.array(list(self.labels))[labels]  # [n, nodes]
        rows = np.arange(n)[:, None]
        out = np.full((n, self.max_len), EDGE_SEP, dtype="<U1")
        out[:, 0 : 3 * self.n_edges : 3] = names[rows, self._parent[order]]
        out[:, 1 : 3 * self.n_edges : 3] = names[rows, self._child[order]]
        tail = 3 * self.n_edges - 1
        out[:, tail] = PROMPT_SEP
        out[:, tail + 1] = names[:, 0]
        out[:, tail + 2] = names[np.arange(n), (goals + 1) * self.arm]
        out[:, tail + 3] = ANSWER_SEP
        path = [names[:, 0]] + [
            names[np.arange(n), goals * self.arm + 1 + i] for i in range(self.arm)
        ]
        for i, column in enumerate(reversed(path) if self.reverse else path):
            out[:, tail + 4 + i] = column
        return ["".join(row) for row in out.tolist()]

    def answer(self, edges: list[Edge], start: str, goal: str) -> str:
        """The answer this language writes: the path from start to goal, reversed with
        ``reverse``."""
        path = solve(edges, start, goal)
        return path[::-1] if self.reverse else path

    # ---- exact probabilities

    def _graphs_with(self, edges: list[Edge]) -> int:
        """Number of labelled star graphs (arms ordered, so d! per graph) containing ``edges``."""
        found = _structure(edges, self.degree)
        if found is None:
            return 0
        arms, chains, seen = found
        d, ll = self.degree, self.arm
        if arms is not None:
            if max(arms) > ll:
                return 0
            slots = tuple(sorted([ll - a for a in arms] + [ll] * (d - len(arms))))
            ways = _falling(d, len(arms)) * _placements(slots, chains)
        else:  # the centre is an unseen label, or the head of one chain
            ways = _placements((ll,) * d, chains)
            for m in sorted(set(chains)):
                if m - 1 <= ll:
                    others = list(chains)
                    others.remove(m)
                    slots = tuple(sorted([ll - (m - 1)] + [ll] * (d - 1)))
                    ways += chains.count(m) * d * _placements(slots, tuple(others))
        return ways * _falling(self.symbols - seen, self.nodes - seen)

    def _zero(self, prefix: str) -> ValueError:
        return ValueError(f"prefix {prefix!r} has probability zero under {self.name}")

    def _expected_char(self, position: int) -> str | None:
        """The fixed separator at ``position`` (None where a label goes)."""
        tail = 3 * self.n_edges - 1
        if position < tail:
            return EDGE_SEP if position % 3 == 2 else None
        return {tail: PROMPT_SEP, tail + 3: ANSWER_SEP}.get(position)

    def _root_and_leaves(self, edges: list[Edge]) -> tuple[str, set[str]] | None:
        """(centre, arm ends) of a complete edge list, None unless it is a path-star graph."""
        if len(edges) != self.n_edges or self._graphs_with(edges) == 0:
            return None
        parents, children = {p for p, _ in edges}, {c for _, c in edges}
        return next(iter(parents - children)), children - parents

    def _check_chars(self, text: str) -> bool:
        return all(
            (c == fixed) if (fixed := self._expected_char(i)) else (c in self.labels)
            for i, c in enumerate(text)
        )

    def next_log_probs(self, prefix: str) -> np.ndarray:
        out = np.full(len(self.alphabet) + 1, -math.inf)
        t, tail = len(prefix), 3 * self.n_edges - 1
        if t > self.max_len or not self._check_chars(prefix):
            raise self._zero(prefix)
        edges = [(e[0], e[1]) for e in prefix[:tail].split(EDGE_SEP) if len(e) == 2]
        if t < tail and t % 3 != 2:  # a label inside the edge list
            weights = np.zeros(len(self.labels))
            for i, label in enumerate(self.labels):
                if t % 3 == 1:
                    weights[i] = self._graphs_with([*edges, (prefix[-1], label)])
                else:
                    weights[i] = sum(self._graphs_with([*edges, (label, x)]) for x in self.labels)
            if weights.sum() == 0:
                raise self._zero(prefix)
            with np.errstate(divide="ignore"):
                out[: len(self.labels)] = np.log(weights / weights.sum())
            return out
        if t < tail:  # an edge separator
            if self._graphs_with(edges) == 0:
                raise self._zero(prefix)
            out[self.alphabet.index(EDGE_SEP)] = 0.0
            return out
        graph = self._root_and_leaves(edges)
        if graph is None:
            raise self._zero(prefix)
        centre, leaves = graph
        query = prefix[tail + 1 : tail + 3]
        if query[:1] not in ("", centre) or query[1:] not in ("", *leaves):
            raise self._zero(prefix)
        if t >= tail + 4 and not self.answer(edges, centre, query[1]).startswith(
            prefix[tail + 4 :]
        ):
            raise self._zero(prefix)
        if t == self.max_len:
            out[-1] = 0.0
        elif (fixed := self._expected_char(t)) is not None:
            out[self.alphabet.index(fixed)] = 0.0
        elif t == tail + 1:
            out[self.alphabet.index(centre)] = 0.0
        elif t == tail + 2:
            for leaf in leaves:
                out[self.alphabet.index(leaf)] = -math.log(self.degree)
        else:
            out[self.alphabet.index(self.answer(edges, centre, query[1])[t - tail - 4])] = 0.0
        return out

    def log_prob(self, string: str) -> float:
        """Closed form: -log(number of strings) for a valid string, -inf otherwise."""
        return -self._log_support() if self._valid(string) else -math.inf

    def _valid(self, string: str) -> bool:
        if len(string) != self.max_len or not self._check_chars(string):
            return False
        edges, start, goal, path = parse_example(string)
        graph = self._root_and_leaves(edges)
        if graph is None:
            return False
        centre, leaves = graph
        return start == centre and goal in leaves and path == self.answer(edges, start, goal)
