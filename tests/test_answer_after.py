"""``--answer-after``: prompt -> answer rows scored only on the answer (path-star, facts), for
every objective, in training and in validation."""

import json

import numpy as np
import pytest
import torch

from shared.errors import ConfigError
from shared.objective import answer_positions, loss_positions
from shared.training import new_run
from shared.training.cli import train_from_argv

PATHSTAR = "synthetic:pathstar?degree=2&arm=2&n=200&n_val=40"


def test_answer_positions_are_the_loss_positions_after_the_first_separator():
    pad, sep = 0, 9
    tokens = torch.tensor(
        [
            [5, 1, 2, sep, 3, 4, 5, 0, 0],  # EOS 5 after the answer counts, padding does not
            [5, sep, 1, sep, 2, 5, 0, 0, 0],  # a second separator inside the answer is scored
        ]
    )
    expected = torch.tensor(
        [
            [0, 0, 0, 0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 1, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    got = answer_positions(tokens, sep, pad)
    assert torch.equal(got, expected)
    assert not (got & ~loss_positions(tokens, pad)).any()


def run(tmp_path, objective: str, *extra: str) -> dict:
    out = tmp_path / objective
    args = [
        "--preset",
        "tiny",
        "--objective",
        objective,
        "--dataset",
        PATHSTAR,
        "--tokenizer",
        "byte",
        "--protocol",
        "padded",
        "--seq-len",
        "20",
        "--max-steps",
        "6",
        "--eval-every",
        "3",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
        *extra,
    ]
    return train_from_argv(args)


@pytest.mark.parametrize("objective", ["ar", "mdm", "bd"])
def test_training_and_validation_score_only_the_answer(tmp_path, objective):
    block = ["--block-size", "4"] if objective == "bd" else []
    full = run(tmp_path / "full", objective, *block)
    answer = run(tmp_path / "answer", objective, "--answer-after", "=", *block)
    # path-star d2 l2: 18 symbols, the answer is the last 3 plus EOS, per 40 validation rows
    assert answer["val_tokens"] == 40 * 4
    assert full["val_tokens"] > answer["val_tokens"]
    config = json.loads((tmp_path / "answer" / objective / "config.json").read_text())
    assert config["train_config"]["answer_after"] == "="
    assert np.isfinite(answer["val_nats_per_token"])


def test_bad_separators_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs protocol='padded'"):
        new_run("tiny", tmp_path / "a", answer_after="=")
    with pytest.raises(ConfigError, match="occurs in no token of"):
        run(tmp_path, "ar", "--answer-after", "#")
    with pytest.raises(ConfigError, match="is 2 tokens"):
        run(tmp_path, "mdm", "--answer-after", "=/")
