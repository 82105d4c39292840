"""Likelihood estimators against hand computation and exact enumeration."""

import itertools
import math

import numpy as np
import pytest
import torch
from exact_mdm import TableDenoiser, exact_nelbo, true_posterior_denoiser

from dllm.masked.objective import MaskedDiffusionObjective
from eval.likelihood import ar_nll, continuation_rows, mdm_chain_rule_nll, mdm_nelbo
from shared.config import ModelConfig
from shared.model import Transformer
from shared.objective import build_objective
from shared.tokenizer import Tokenizer

PAD = 99


def test_ar_nll_matches_hand_computation_and_bits_per_byte_is_exact():
    tokenizer = Tokenizer.byte()
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            vocab_size=tokenizer.vocab_size,
            dim=16,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            hidden_dim=32,
            max_seq_len=32,
        )
    ).eval()
    texts = ["héllo", "a ☃ b!"]
    rows = np.full((2, 12), tokenizer.pad_id)
    for i, text in enumerate(texts):
        ids = [tokenizer.eos_id, *tokenizer.encode(text)]
        rows[i, : len(ids)] = ids
    objective = build_objective("ar", pad_id=tokenizer.pad_id)
    estimate = ar_nll(model, objective, rows, tokenizer.token_bytes(), batch_size=1)
    manual = 0.0
    with torch.no_grad():
        for row in rows:
            log_probs = torch.log_softmax(model(torch.tensor(row[None]), "causal")[0].double(), -1)
            for i in range(1, len(row)):
                if row[i] != tokenizer.pad_id:
                    manual -= float(log_probs[i - 1, row[i]])
    assert estimate.nats == pytest.approx(manual, rel=1e-6)
    assert estimate.bytes == sum(len(t.encode("utf-8")) for t in texts)
    assert estimate.tokens == sum(len(t.encode("utf-8")) for t in texts)
    assert estimate.bits_per_byte == pytest.approx(manual / math.log(2) / estimate.bytes)
    assert sum(estimate.row_nats) == pytest.approx(manual, rel=1e-6)


def mdm_objective(vocab: int, estimator: str = "time") -> MaskedDiffusionObjective:
    objective = MaskedDiffusionObjective(pad_id=PAD, estimator=estimator)
    objective.model_vocab_size(vocab)
    return objective


@pytest.mark.parametrize("estimator", ["time", "count"])
def test_mc_nelbo_converges_to_the_exact_integral_and_its_interval_covers_it(estimator):
    vocab, row = 3, [0, 1, 2, 2, 0]
    model = TableDenoiser(vocab, len(row), seed=3)
    objective = mdm_objective(vocab, estimator)
    t_low = objective.t_eps if estimator == "time" else 0.0
    exact = exact_nelbo(model, row, vocab, objective.schedule, t_low)
    rows = np.array([row] * 40)
    estimate = mdm_nelbo(
        model,
        objective,
        rows,
        np.ones(vocab + 1, dtype=np.int64),
        samples=64,
        batch_size=640,
        seed=1,
    )
    mean_per_row = estimate.nats / len(rows)
    stderr_per_row = estimate.stderr / len(rows)
    assert abs(mean_per_row - exact) < 4 * stderr_per_row
    assert stderr_per_row < 0.05 * exact  # precise enough that the check above has teeth
    low, high = estimate.as_dict()["nats_per_token_ci95"]
    per_token = exact / (len(row) - 1)
    assert low - 2 * stderr_per_row < per_token < high + 2 * stderr_per_row


def enumerate_rows(vocab: int, n: int):
    return [[0, *x] for x in itertools.product(range(vocab), repeat=n)]


def test_chain_rule_likelihood_sums_to_one_over_all_sequences():
    vocab, n = 3, 3
    model = TableDenoiser(vocab, n + 1, seed=5)
    objective = mdm_objective(vocab)
    rows = np.array(enumerate_rows(vocab, n))
    estimate = mdm_chain_rule_nll(
        model, objective, rows, np.ones(vocab + 1, dtype=np.int64), batch_size=8
    )
    total = sum(math.exp(-nats) for nats in estimate.row_nats)
    assert total == pytest.approx(1.0, abs=1e-9)


def chain_rule_for_order(model: TableDenoiser, row: list[int], order: list[int], vocab: int):
    state = [row[0]] + [vocab] * (len(row) - 1)
    nats = 0.0
    for position in order:
        log_probs = torch.log_softmax(
            model.table[model.index(torch.tensor(state))][:, :vocab].double(), -1
        )
        nats -= float(log_probs[position, row[position]])
        state[position] = row[position]
    return nats


def test_nelbo_relations_to_chain_rule_likelihoods():
    """What theory says, asserted exactly (linear schedule, t from 0):

    1. The NELBO of a string equals the chain-rule NLL averaged over all unmasking orders, so it
       bounds the NLL of the random-order sampler (Jensen), per string.
    2. For the exact posterior of a data distribution every order's chain rule is exact, so
       NELBO = left-to-right NLL = -log p(x).
    3. For other denoisers the NELBO is *not* ordered against the left-to-right NLL: either side
       can be larger, so comparing them string by string says nothing in general.
    """
    vocab, n = 3, 3
    model = TableDenoiser(vocab, n + 1, seed=7)
    objective = mdm_objective(vocab)
    rows = enumerate_rows(vocab, n)
    left_to_right = mdm_chain_rule_nll(
        model, objective, np.array(rows), np.ones(vocab + 1, dtype=np.int64), batch_size=27
    ).row_nats
    orders = list(itertools.permutations(range(1, n + 1)))
    above, below = 0, 0
    for row, l2r in zip(rows, left_to_right):
        per_order = [chain_rule_for_order(model, row, list(o), vocab) for o in orders]
        nelbo = exact_nelbo(model, row, vocab, objective.schedule, 0.0)
        assert nelbo == pytest.approx(sum(per_order) / len(per_order), rel=1e-6)  # 1.
        sampler_nll = -math.log(sum(math.exp(-v) for v in per_order) / len(per_order))
        assert nelbo >= sampler_nll - 1e-9
        assert l2r == pytest.approx(per_order[0], rel=1e-9)
        above += nelbo > l2r + 1e-6
        below += nelbo < l2r - 1e-6
    assert above > 0 and below > 0  # 3.

    weights = torch.rand(vocab**n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    probs = {
        x: float(w)
        for x, w in zip(itertools.product(range(vocab), repeat=n), weights / weights.sum())
    }
    optimal = true_posterior_denoiser(probs, vocab)
    exact_rows = mdm_chain_rule_nll(
        optimal, objective, np.array(rows), np.ones(vocab + 1, dtype=np.int64), batch_size=27
    ).row_nats
    for row, l2r in zip(rows, exact_rows):  # 2.
        target = -math.log(probs[tuple(row[1:])])
        assert l2r == pytest.approx(target, abs=1e-6)
        assert exact_nelbo(optimal, row, vocab, objective.schedule, 0.0) == pytest.approx(
            target, abs=1e-6
        )


def test_conditional_likelihood_scores_only_the_continuation():
    rows, scored = continuation_rows([[5, 6], [7]], [[1, 2, 3], [4]], bos_id=0, pad_id=PAD)
    assert rows.tolist() == [[0, 5, 6, 1, 2, 3], [0, 7, 4, PAD, PAD, PAD]]
    assert scored.tolist() == [
        [False, False, False, True, True, True],
        [False, False, True, False, False, False],
    ]
    with pytest.raises(ValueError, match="2 prompts but 1 continuations"):
        continuation_rows([[1], [2]], [[3]], bos_id=0, pad_id=PAD)
    # AR conditional NLL = full-row NLL minus the prompt's NLL (chain rule).
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            vocab_size=20,
            dim=16,
            n_layers=1,
            n_heads=2,
            n_kv_heads=2,
            hidden_dim=32,
            max_seq_len=16,
        )
    ).eval()
    objective = build_objective("ar", pad_id=19)
    rows, scored = continuation_rows([[3, 4, 5]], [[6, 7]], bos_id=0, pad_id=19)
    table = np.ones(20, dtype=np.int64)
    conditional = ar_nll(model, objective, rows.numpy(), table, batch_size=1, scored=scored)
    full = ar_nll(model, objective, rows.numpy(), table, batch_size=1)
    prompt_only = ar_nll(model, objective, rows[:, :4].numpy(), table, batch_size=1)
    assert conditional.tokens == 2
    assert conditional.nats == pytest.approx(full.nats - prompt_only.nats, rel=1e-5)


def test_mdm_conditional_keeps_the_prompt_visible():
    vocab = 3
    model = TableDenoiser(vocab, 4, seed=9)
    objective = mdm_objective(vocab)
    rows, scored = continuation_rows([[2]], [[1, 0]], bos_id=0, pad_id=PAD)
    estimate = mdm_chain_rule_nll(
        model,
        objective,
        rows.numpy(),
        np.ones(vocab + 1, dtype=np.int64),
        batch_size=1,
        scored=scored,
    )
    # By hand: position 2 given [BOS, 2, M, M], then position 3 given [BOS, 2, 1, M].
    first = torch.log_softmax(model.table[model.index(torch.tensor([0, 2, 3, 3]))][2, :3], -1)
    second = torch.log_softmax(model.table[model.index(torch.tensor([0, 2, 1, 3]))][3, :3], -1)
    assert estimate.nats == pytest.approx(-float(first[1] + second[0]), rel=1e-6)
    with pytest.raises(ValueError, match="samples=1"):
        mdm_nelbo(
            model, objective, rows.numpy(), np.ones(4, dtype=np.int64), samples=1, batch_size=4
        )


def test_evaluate_checkpoint_records_protocol_and_interval(tmp_path):
    from eval.likelihood import evaluate_checkpoint, main
    from shared.training import cli

    cache = tmp_path / "cache"
    args = [
        "--preset",
        "tiny",
        "--max-steps",
        "3",
        "--eval-every",
        "100",
        "--cache-dir",
        str(cache),
    ]
    cli.train_from_argv([*args, "--objective", "mdm", "--out", str(tmp_path / "mdm")])
    results = evaluate_checkpoint(
        str(tmp_path / "mdm"),
        samples=2,
        chain_rule_rows=2,
        max_rows=4,
        batch_size=8,
        cache_dir=str(cache),
    )
    assert results["protocol"]["protocol"] == "packed" and results["protocol"]["seq_len"] == 32
    nelbo = results["estimates"]["nelbo"]
    assert nelbo["nats_per_token_stderr"] > 0
    assert (
        nelbo["nats_per_token_ci95"][0] < nelbo["nats_per_token"] < nelbo["nats_per_token_ci95"][1]
    )
    assert results["estimates"]["chain_rule_nll"]["nats_per_token_stderr"] == 0
    assert math.isfinite(results["estimates"]["chain_rule_nll"]["bits_per_byte"])
    assert main([str(tmp_path / "missing")]) == 2
    assert main([str(tmp_path / "mdm"), "--samples", "1", "--cache-dir", str(cache)]) == 2

    # --val-dataset: a file evaluated whole (its bytes all scored), never held out in part
    text = "".join(f"Document {i} of the validation file.\n\n" for i in range(40))
    (tmp_path / "valid.txt").write_text(text)
    whole = evaluate_checkpoint(
        str(tmp_path / "mdm"), val_dataset=str(tmp_path / "valid.txt"), samples=2,
        cache_dir=str(cache),
    )  # fmt: skip
    splits = whole["protocol"]["splits"]
    assert splits["validation"]["n_documents"] == splits["train"]["n_documents"] == 40
    with pytest.raises(ValueError, match="give it alone"):
        evaluate_checkpoint(str(tmp_path / "mdm"), dataset="kjv", val_dataset="x.txt")


@pytest.mark.parametrize("batch_size, micro_batch", [(4, None), (5, 2), (3, 1)])
def test_rank_shares_add_up_and_every_rank_runs_the_same_number_of_forwards(
    batch_size, micro_batch
):
    """Sharded (FSDP) models gather weights inside every forward, so a rank that ran fewer
    forwards than the others would hang them; the shares must still sum to one process."""
    from shared.validation import evaluate_rows

    torch.manual_seed(0)
    vocab = 11
    objective = mdm_objective(vocab)
    model = Transformer(
        ModelConfig(
            vocab_size=vocab + 1,
            dim=16,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            hidden_dim=32,
            max_seq_len=8,
        )
    )
    forwards: list[int] = []
    model.register_forward_hook(lambda module, args, output: forwards.append(1))
    rows = np.random.default_rng(0).integers(0, vocab, size=(9, 6))  # last batch is ragged
    token_bytes = np.ones(vocab + 1, dtype=np.int64)

    def run(rank: int, world: int):
        forwards.clear()
        totals = evaluate_rows(
            model,
            objective,
            rows,
            token_bytes,
            batch_size=batch_size,
            seed=3,
            device=torch.device("cpu"),
            pad_id=PAD,
            micro_batch=micro_batch,
            rank=rank,
            world=world,
        )
        return totals, len(forwards)

    whole, _ = run(0, 1)
    shares = [run(rank, 3) for rank in range(3)]
    assert len({count for _, count in shares}) == 1  # the same number of forwards on each rank
    assert sum(t.tokens for t, _ in shares) == whole.tokens
    assert sum(t.bytes for t, _ in shares) == whole.bytes
    assert sum(t.nats for t, _ in shares) == pytest.approx(whole.nats, rel=1e-6)
