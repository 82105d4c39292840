"""The lm-evaluation-harness wrapper, driven through the harness's own API on a local task."""

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")

from shared.training import cli  # noqa: E402


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    args = [
        "--preset",
        "tiny",
        "--max-steps",
        "60",
        "--eval-every",
        "1000",
        "--lr",
        "1e-2",
        "--cache-dir",
        str(root / "cache"),
    ]
    for objective in ("ar", "mdm"):
        cli.train_from_argv([*args, "--objective", objective, "--out", str(root / objective)])
    return root


TASKS = """
task: duolm_toy_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""

ROLLING = """
task: duolm_toy_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{question}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""

GENERATE = """
task: duolm_toy_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: " the"
generation_kwargs:
  until: ["."]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    rows = [
        {"question": "And God said, Let there be", "choices": [" light", " xqzv"], "answer": 0},
        {
            "question": "In the beginning God created the",
            "choices": [" heaven", " qqqq"],
            "answer": 0,
        },
        {"question": "And the LORD spake unto", "choices": [" Moses", " zzkx"], "answer": 0},
    ]
    data = root / "toy.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for name, text in (("choice", TASKS), ("rolling", ROLLING), ("generate", GENERATE)):
        (root / f"{name}.yaml").write_text(text.format(data=data))
    return root


@pytest.mark.parametrize("objective", ["ar", "mdm"])
def test_harness_runs_all_request_types_on_a_local_task(objective, checkpoints, task_dir):
    from lm_eval.tasks import TaskManager

    from eval.harness import DuoLM, harness_info

    lm = DuoLM(str(checkpoints / objective), samples=4, max_gen_toks=8, diffusion_steps=8)
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["duolm_toy_choice", "duolm_toy_rolling", "duolm_toy_generate"],
        task_manager=manager,
        bootstrap_iters=0,
        log_samples=False,
    )["results"]
    accuracy = results["duolm_toy_choice"]["acc,none"]
    assert 0.0 <= accuracy <= 1.0
    assert math.isfinite(results["duolm_toy_rolling"]["bits_per_byte,none"])
    assert results["duolm_toy_rolling"]["bits_per_byte,none"] > 0
    assert "exact_match,none" in results["duolm_toy_generate"]
    info = harness_info(lm)
    assert info["likelihood"] == ("exact" if objective == "ar" else "bound (NELBO)")


def test_loglikelihood_matches_the_likelihood_module(checkpoints):
    from eval.harness import DuoLM
    from eval.likelihood import ar_nll, continuation_rows

    lm = DuoLM(str(checkpoints / "ar"))

    class Request:
        def __init__(self, *args):
            self.args = args

    ((score, _),) = lm.loglikelihood([Request("And God said", " unto")])
    tok = lm.tokenizer
    rows, scored = continuation_rows(
        [tok.encode("And God said")], [tok.encode(" unto")], bos_id=tok.eos_id, pad_id=tok.pad_id
    )
    estimate = ar_nll(
        lm.model, lm.objective, rows.numpy(), tok.token_bytes(), batch_size=1, scored=scored
    )
    assert score == pytest.approx(-estimate.nats, rel=1e-6)
    # rolling: a text shorter than the context is one window, the whole row from BOS
    (total,) = lm.loglikelihood_rolling([Request("And God said")])
    whole, whole_scored = continuation_rows(
        [[]], [tok.encode("And God said")], bos_id=tok.eos_id, pad_id=tok.pad_id
    )
    expected = ar_nll(
        lm.model, lm.objective, whole.numpy(), tok.token_bytes(), batch_size=1, scored=whole_scored
    )
    assert total == pytest.approx(-expected.nats, rel=1e-6)
