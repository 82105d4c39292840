"""Dataset specs of synthetic languages: parsing, building (cached) the language a spec names, and
its train/validation strings. Specs for ``shared.data.corpus.load_corpus``::

    synthetic:hmm
    synthetic:pcfg?max_depth=3&seed=2
    synthetic:teacher?seed=1&n=20000&n_val=1000
    synthetic:facts?pairs=16&both=8&seed=0
    synthetic:pathstar?degree=3&arm=4&symbols=26&n=20000&n_val=1000&seed=0

``n``/``n_val`` are the numbers of train/validation strings (drawn i.i.d. from different seeds),
``seed`` picks the language itself; the other keys are the constructor arguments of each family.
"""

from __future__ import annotations

import urllib.parse

from shared.data.synthetic.base import Language, derive_seed
from shared.data.synthetic.facts import FactsLanguage
from shared.data.synthetic.hmm import HMMLanguage
from shared.data.synthetic.pathstar import PathStarLanguage
from shared.data.synthetic.pcfg import PCFGLanguage
from shared.data.synthetic.teacher import TeacherLanguage

PREFIX = "synthetic:"

LANGUAGES: dict[str, type[Language]] = {
    "hmm": HMMLanguage,
    "pcfg": PCFGLanguage,
    "teacher": TeacherLanguage,
    "facts": FactsLanguage,
    "pathstar": PathStarLanguage,
}
RANDOM_LANGUAGES = ["hmm", "pcfg", "teacher"]
PROBE_LANGUAGES = ["facts", "pathstar"]
CORPUS_KEYS = {"n": 20_000, "n_val": 1_000}
# spec keys per language and how to parse their values (``seed`` is common to all)
_PARAMS: dict[str, dict[str, type]] = {
    "hmm": {
        "states": int,
        "vocab": int,
        "max_len": int,
        "stop_min": float,
        "stop_max": float,
        "concentration": float,
    },
    "pcfg": {"types": int, "max_depth": int, "children": list, "type_probs": list},
    "teacher": {"vocab": int, "length": int, "dim": int, "layers": int, "sharpness": float},
    "facts": {"pairs": int, "both": int},
    "pathstar": {"degree": int, "arm": int, "symbols": int, "reverse": int},
}


def is_synthetic(spec: str) -> bool:
    return str(spec).startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, object], dict[str, int]]:
    """``synthetic:<kind>?k=v&...`` -> (kind, language kwargs, corpus settings n/n_val)."""
    if not is_synthetic(spec):
        raise ValueError(f"dataset {spec!r} is not a synthetic spec (must start with {PREFIX!r})")
    body = spec[len(PREFIX) :]
    kind, _, query = body.partition("?")
    if kind not in LANGUAGES:
        raise ValueError(
            f"synthetic language {kind!r} in {spec!r} is unknown; valid: {RANDOM_LANGUAGES} "
            f"and the probe tasks {PROBE_LANGUAGES} (the reversal probe's fact table, the "
            "path-star planning task)"
        )
    kwargs: dict[str, object] = {}
    corpus = dict(CORPUS_KEYS)
    params = {**_PARAMS[kind], "seed": int}
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        try:
            if key in CORPUS_KEYS:
                corpus[key] = int(value)
            elif key in params:
                kind_of = params[key]
                kwargs[key] = (
                    [float(v) for v in value.split(",")] if kind_of is list else kind_of(value)
                )
            else:
                valid = sorted([*params, *CORPUS_KEYS])
                raise ValueError(f"unknown key {key!r}; valid keys for {kind}: {valid}")
        except ValueError as exc:
            raise ValueError(f"synthetic spec {spec!r}: {key}={value!r}: {exc}") from exc
    if corpus["n"] < 1 or corpus["n_val"] < 1:
        raise ValueError(
            f"synthetic spec {spec!r}: n={corpus['n']} and n_val={corpus['n_val']} must be >= 1"
        )
    return kind, kwargs, corpus


_CACHE: dict[str, Language] = {}


def build_language(spec: str) -> Language:
    """The language a ``synthetic:...`` spec names (corpus keys n/n_val are ignored). Cached:
    building the teacher or enumerating is not free, and languages are immutable in use."""
    kind, kwargs, _ = parse_spec(spec)
    key = f"{kind}?{sorted(kwargs.items())}"
    if key not in _CACHE:
        _CACHE[key] = LANGUAGES[kind](**kwargs)  # type: ignore[arg-type]
    return _CACHE[key]


def corpus_splits(spec: str) -> tuple[list[str], list[str]]:
    """(train, validation) strings for a spec: independent i.i.d. draws from two seed streams."""
    _, kwargs, corpus = parse_spec(spec)
    language = build_language(spec)
    seed = int(kwargs.get("seed", 0))  # type: ignore[arg-type]
    train = language.sample(corpus["n"], derive_seed(seed, 1))
    validation = language.sample(corpus["n_val"], derive_seed(seed, 2))
    return train, validation
