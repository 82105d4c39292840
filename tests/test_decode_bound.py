"""bench/decode_bound.py: the bytes a batch-1 decode step must read, counted by hand, and the
benchmark end to end at a tiny shape (no timing is asserted)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import decode_bound  # noqa: E402


@pytest.mark.parametrize("tie", [False, True])
def test_bytes_per_step_counts_weights_one_embedding_row_and_the_cache(tie):
    model = decode_bound.model_for("tiny", vocab=100)
    if tie:
        model.output.weight = model.tok_embeddings.weight
        model.config = model.config.__class__(**{**vars(model.config), "tie_embeddings": True})
    # tiny: dim 32, 2 layers, 4 heads, 2 KV heads (head_dim 8), hidden 64
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32  # wq wk wv wo w1-3 norms
    weights = 2 * per_layer + 32 + 100 * 32 + 32  # final norm, output head, one embedding row
    kv = 2 * 2 * 2 * 8 * 10  # keys and values, layers, KV heads, head_dim, 10 slots
    assert decode_bound.bytes_per_step(model, 10) == 4 * (weights + kv)


def test_the_benchmark_runs_at_a_tiny_shape(capsys):
    rows = decode_bound.measure("tiny", [16, 24], new_tokens=4, repeats=1, vocab=100)
    assert [r.context for r in rows] == [16, 24]
    assert all(r.step_ms > 0 and math.isfinite(r.fraction) and r.fraction > 0 for r in rows)
    assert rows[1].bytes_per_step - rows[0].bytes_per_step == 4 * 2 * 2 * 2 * 8 * 8
    with pytest.raises(SystemExit, match="must exceed --new-tokens"):
        decode_bound.measure("tiny", [4], new_tokens=4, repeats=1, vocab=100)
