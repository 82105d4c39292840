"""The lm-evaluation-harness model "duolm", with lm-eval itself as the oracle: per item, the AR
run scores what lm-eval's own ``hf`` backend scores on the run's export (local tasks, offline);
the MDM's scores do not depend on the batch; bad model arguments are one line each."""

import json
import math

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from arlm.export import export_checkpoint  # noqa: E402
from eval import cli  # noqa: E402
from eval.harness import DuoLM, argument_names  # noqa: E402
from shared.checkpoint import load_model_from_checkpoint  # noqa: E402
from shared.errors import ConfigError  # noqa: E402

# lm-eval's hf backend sums float32 log-probabilities; ours are summed in float64
TOLERANCE = 1e-4
# Float rounding only: another batch is another matrix shape for the same rows (seen: 2e-7
# nats); before the noise was the item's, batch 4 vs 8 moved an item by up to 46 nats
ROUNDING = 1e-5

TASK = """
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
{body}
"""

CHOICE = """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""

ROLLING = """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
"""

GENERATE = """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: " the"
generation_kwargs:
  until: [{stop}]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
"""

VERSE = "And the earth was without form, and void; and darkness was upon the face of the deep."


def greedy_text(run, context: str, n: int) -> str:
    """The AR run's own greedy continuation of ``context`` ([BOS] + context), as text."""
    model, tokenizer, _ = load_model_from_checkpoint(run)
    ids = [tokenizer.eos_id, *tokenizer.encode(context)]
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]), attention="causal")[0, -1].argmax()))
    return tokenizer.decode(ids[-n:])


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, tiny_runs):
    root = tmp_path_factory.mktemp("tasks")
    greedy = greedy_text(tiny_runs["ar"], "And God said", 3)
    choices = [
        # a context ending in a space: lm-eval moves the space into the continuation
        {"question": "In the beginning God created the ", "choices": ["heaven", "qqqq"]},
        {"question": "And God said, Let there be", "choices": [" light", " xqzv", " dark"]},
        # longer than the short context below: truncated from the left
        {"question": VERSE + " And the Spirit of God moved", "choices": [" upon", ","]},
        # the model's own greedy tokens: is_greedy must come out True
        {"question": "And God said", "choices": [greedy, greedy[::-1] + "q"]},
        # one-token answers (one byte each): one forward pass serves all three
        {"question": "And God said,", "choices": [" ", "L", "q"]},
    ]
    documents = [{"text": "And God said, Let there be light: and there was light."}]
    documents.append({"text": " ".join([VERSE] * 3)})  # several windows at either context
    for name, rows, body in (
        ("duolm_choice", [c | {"answer": 0} for c in choices], CHOICE),
        ("duolm_rolling", documents, ROLLING),
        ("duolm_generate", [{"question": q} for q in GENERATE_PROMPTS], GENERATE),
    ):
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        body = body.replace("{stop}", json.dumps(generation_stop(tiny_runs["ar"])))
        (root / f"{name}.yaml").write_text(TASK.format(name=name, data=data, body=body))
    return root


GENERATE_PROMPTS = ["In the beginning God created the ", "And God said, Let there be"]


def generation_stop(run) -> str:
    """A stop string the AR run's first greedy continuation holds (its third character)."""
    return greedy_text(run, GENERATE_PROMPTS[0], 6)[2]


@pytest.fixture(scope="module")
def exported_ar(tmp_path_factory, tiny_runs):
    folder = tmp_path_factory.mktemp("export") / "ar"
    export_checkpoint(str(tiny_runs["ar"]), str(folder), False)
    return folder


def per_item(model: str, model_args: dict, task_dir, tasks: list[str], batch_size=4) -> dict:
    """{task: [each document's responses]} from lm-eval's own evaluation loop."""
    results = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        device="cpu",
        batch_size=batch_size,
        log_samples=True,
        bootstrap_iters=0,
    )
    return {
        task: [sample["filtered_resps"] for sample in samples]
        for task, samples in results["samples"].items()
    }


def flat(responses: list) -> list:
    """(log-likelihood, is_greedy) or log-likelihood per request, documents in order."""
    return [r if isinstance(r, float) else tuple(r) for doc in responses for r in doc]


@pytest.mark.parametrize("max_length", [None, 12])
def test_per_item_loglikelihoods_equal_the_hf_backend_on_the_export(
    max_length, tiny_runs, exported_ar, task_dir
):
    """Multiple choice (a context ending in a space, one truncated at the short context, the
    model's greedy tokens) and rolling perplexity of texts shorter and longer than the context;
    with no max_length duolm takes the run's row length, given to hf explicitly."""
    seq_len = 32  # the tiny preset's rows
    tasks = ["duolm_choice", "duolm_rolling"]
    ours = per_item(
        "duolm",
        {"checkpoint": str(tiny_runs["ar"])} | ({"max_length": max_length} if max_length else {}),
        task_dir,
        tasks,
    )
    theirs = per_item(
        "hf",
        {"pretrained": str(exported_ar), "dtype": "float32", "max_length": max_length or seq_len},
        task_dir,
        tasks,
    )
    choice_ours, choice_theirs = flat(ours["duolm_choice"]), flat(theirs["duolm_choice"])
    assert len(choice_ours) == len(choice_theirs) == 12
    for (score, greedy), (expected, expected_greedy) in zip(choice_ours, choice_theirs):
        assert score == pytest.approx(expected, abs=TOLERANCE)
        assert greedy == expected_greedy
    assert any(greedy for _, greedy in choice_theirs)  # the greedy item is one
    rolling_ours, rolling_theirs = flat(ours["duolm_rolling"]), flat(theirs["duolm_rolling"])
    assert rolling_ours == pytest.approx(rolling_theirs, abs=TOLERANCE)
    assert len(" ".join([VERSE] * 3)) > 2 * seq_len  # longer than the context: several windows


def test_requests_sharing_the_model_input_share_one_forward_pass(tiny_runs):
    """An item's one-token answers, and a request repeated, are scored from one pass (as hf
    groups them), each as it scores alone."""
    lm = DuoLM(str(tiny_runs["ar"]), batch_size=1, device="cpu")
    context = "And God said, Let there be"
    requests = [Instance("loglikelihood", {}, (context, answer), idx=0) for answer in " lq"]
    requests.append(Instance("loglikelihood", {}, (context, " light"), idx=0))
    requests.append(Instance("loglikelihood", {}, (context, " light"), idx=0))
    passes = []
    hook = lm.model.register_forward_hook(lambda *_: passes.append(1))
    together = lm.loglikelihood(requests, disable_tqdm=True)
    assert len(passes) == 2  # the three one-token answers; the two equal requests
    alone = [lm.loglikelihood([request], disable_tqdm=True)[0] for request in requests]
    hook.remove()
    assert len(passes) == 2 + len(requests)
    for (score, greedy), (expected, expected_greedy) in zip(together, alone):
        assert score == pytest.approx(expected, abs=ROUNDING)
        assert greedy == expected_greedy


def mdm_requests() -> tuple[list[Instance], list[Instance]]:
    """Multiple-choice requests, and another task's requests of other lengths."""
    pairs = [
        ("In the beginning God created the", " heaven"),
        ("In the beginning God created the", " earth"),
        ("And God said, Let there be", " light"),
        ("And God said, Let there be", " darkness upon the deep"),
        ("", "And the LORD spake"),
        (VERSE, " And the Spirit"),
    ]
    others = [(VERSE[:n], VERSE[n : n + 7]) for n in (3, 11, 19, 40, 52)]

    def instances(items, task):
        return [
            Instance("loglikelihood", {}, pair, idx=i, metadata=(task, i, 1))
            for i, pair in enumerate(items)
        ]

    return instances(pairs, "choice"), instances(others, "other")


def test_mdm_scores_do_not_depend_on_batch_size_or_batch_mates(tiny_runs):
    requests, others = mdm_requests()
    torch.manual_seed(1234)  # lm-eval's default torch seed
    scores = {}
    for batch_size in (1, 4, 8):
        lm = DuoLM(str(tiny_runs["mdm"]), batch_size=batch_size, draws=4, device="cpu")
        scores[batch_size] = lm.loglikelihood(requests)
    # interleaved with another task's rows, at the largest batch: every batch has strangers
    mixed = [r for pair in zip(requests, others) for r in pair] + requests[len(others) :]
    lm = DuoLM(str(tiny_runs["mdm"]), batch_size=8, draws=4, device="cpu")
    in_company = lm.loglikelihood(mixed)
    scores["mixed"] = [in_company[mixed.index(r)] for r in requests]
    reference = scores[1]
    for found in scores.values():
        assert [s for s, _ in found] == pytest.approx([s for s, _ in reference], abs=ROUNDING)
        assert [g for _, g in found] == [g for _, g in reference]
    # the noise is the item's: two equal requests in one call get one score
    twice = lm.loglikelihood([requests[0], requests[0]])
    assert twice[0][0] == twice[1][0] == pytest.approx(reference[0][0], abs=ROUNDING)


def test_mdm_scores_follow_lm_evals_seed_and_carry_a_standard_error(tiny_runs, task_dir):
    """lm-eval's --seed (its torch seed) moves the noise, the same seed repeats it, and the
    results record each item's standard error with the estimator and draws."""

    def evaluate(torch_seed: int) -> dict:
        return lm_eval.simple_evaluate(
            model="duolm",
            model_args={"checkpoint": str(tiny_runs["mdm"]), "draws": 3},
            tasks=["duolm_choice"],
            task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
            device="cpu",
            batch_size=4,
            torch_random_seed=torch_seed,
            log_samples=True,
            bootstrap_iters=0,
        )

    first, again, other = evaluate(7), evaluate(7), evaluate(8)

    def scores(results):
        return flat([sample["filtered_resps"] for sample in results["samples"]["duolm_choice"]])

    assert scores(first) == scores(again)
    assert scores(first) != scores(other)
    info = first["config"]["duolm"]
    assert (info["estimator"], info["draws"], info["seed"]) == ("time", 3, 7)
    items = info["items"]
    assert [item["loglikelihood"] for item in items] == [score for score, _ in scores(first)]
    assert all(item["stderr"] > 0 and math.isfinite(item["stderr"]) for item in items)


def test_generation_is_greedy_and_cut_at_the_stop_string(tiny_runs, task_dir):
    """The AR's text is its own greedy continuation (6 tokens) cut at the first stop string;
    the MDM's holds no stop string either."""
    stop = generation_stop(tiny_runs["ar"])
    for objective in ("ar", "mdm"):
        responses = per_item(
            "duolm",
            {"checkpoint": str(tiny_runs[objective]), "diffusion_steps": 4},
            task_dir,
            ["duolm_generate"],
        )
        texts = [text for doc in responses["duolm_generate"] for text in doc]
        assert len(texts) == 2 and all(stop not in text for text in texts)
        if objective == "ar":
            greedy = [greedy_text(tiny_runs["ar"], p, 6) for p in GENERATE_PROMPTS]
            # the first holds the stop string, so an uncut text cannot pass
            assert texts == [text.split(stop)[0] for text in greedy]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"pretrained": "x"}, r"unknown duolm model argument\(s\) pretrained; valid: checkpoint,"),
        ({"batch_size": 0}, r"batch_size=0 must be an integer >= 1"),
        ({"batch_size": "auto"}, r"batch_size='auto' must be an integer >= 1"),
        ({"draws": 1}, r"draws=1 must be an integer >= 2"),
        ({"draws": -3}, r"draws=-3 must be an integer >= 2"),
        (
            {"max_length": 65},
            r"max_length=65 must be an integer in 2..64 \(the model's positions; the run "
            r"trained on rows of 32\)",
        ),
        ({"max_length": 1}, r"max_length=1 must be an integer in 2..64"),
        ({"estimator": "exact"}, r"estimator='exact' must be one of"),
        ({"dtype": "auto"}, r"dtype='auto' must be one of float32, bfloat16, float16"),
        ({"device": "tpu"}, r"--device 'tpu' is not a device; use cpu, cuda or cuda:N"),
        ({"device": "mps"}, r"--device 'mps': only cpu and cuda devices are supported"),
    ],
)
def test_bad_model_arguments_are_refused_in_one_line(arguments, message, tiny_runs):
    with pytest.raises(ConfigError, match=message) as refused:
        DuoLM.create_from_arg_obj({"checkpoint": str(tiny_runs["mdm"])} | arguments)
    assert "\n" not in str(refused.value)


def test_a_folder_that_is_not_a_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint='.*' is not a duolm run"):
        DuoLM(str(tmp_path))


def test_a_run_of_another_objective_is_refused_in_one_line(tiny_runs, monkeypatch):
    from eval import harness

    model, tokenizer, state = load_model_from_checkpoint(tiny_runs["mdm"])
    udm = (model, tokenizer, state | {"objective": "udm"})
    monkeypatch.setattr(harness, "load_model_from_checkpoint", lambda *_: udm)
    with pytest.raises(ConfigError, match=r"is a 'udm' run; .* scores 'ar' and 'mdm' runs$"):
        DuoLM(str(tiny_runs["mdm"]))


def test_command_line_arguments_arrive_typed(tiny_runs):
    """lm-eval's command line passes --batch_size and --model_args values as text."""
    lm = DuoLM.create_from_arg_string(
        f"checkpoint={tiny_runs['mdm']},max_length=20,draws=5,seed=3",
        {"batch_size": "8", "max_batch_size": None, "device": "cpu"},
    )
    assert (lm.batch_size, lm.max_length, lm.draws, lm.seed) == (8, 20, 5, 3)
    # lm-eval's command line always adds --batch_size and --device: --model_args wins
    lm = DuoLM.create_from_arg_string(
        f"checkpoint={tiny_runs['ar']},batch_size=2,device=cpu", {"batch_size": 1, "device": "x"}
    )
    assert (lm.batch_size, str(lm.device)) == (2, "cpu")
    assert DuoLM(str(tiny_runs["ar"])).max_length == 32  # the run's rows, not its 64 positions
    assert argument_names()[:3] == ["checkpoint", "batch_size", "max_batch_size"]


def test_duolm_lm_eval_runs_lm_evals_command_line(tiny_runs, task_dir, tmp_path, capsys):
    """``duolm lm-eval`` is lm-eval's own command line with the model registered (lm-eval
    indexes its own task folders first, about 10 s); a bad model argument is one line."""
    common = ["--tasks", "duolm_choice", "--include_path", str(task_dir), "--device", "cpu"]
    status = cli.main(
        ["lm-eval", "--model", "duolm", "--model_args", f"checkpoint={tiny_runs['ar']}"]
        + [*common, "--batch_size", "4", "--output_path", str(tmp_path / "out")]
    )
    assert status == 0
    (written,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(written.read_text())
    assert results["config"]["duolm"]["likelihood"] == "exact"
    assert "acc,none" in results["results"]["duolm_choice"]
    capsys.readouterr()
    status = cli.main(
        ["lm-eval", "--model", "duolm", "--model_args", f"checkpoint={tiny_runs['ar']},nope=1"]
        + common
    )
    assert status == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: unknown duolm model argument(s) nope")
