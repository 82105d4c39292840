"""The one sample-and-judge path (eval/sample_sets.py): one EOS policy for every family (a model
that emits EOS at once gives empty samples under AR and diffusion alike), token-weighted judge
perplexity and held-out documents cut as samples are (the stage cache's key: test_stage_key.py)."""

import math

import numpy as np
import pytest
import torch

from arlm.generate import ARGenerator, GenerationConfig
from dllm.generator import DiffusionGenerator
from dllm.sampler import SamplerConfig
from dllm.strategies import Ancestral
from eval.experiments.stages import held_out_documents
from eval.quality import JudgeScore, log_perplexity_interval
from eval.sample_sets import SampleSet, ar_sample_set, diffusion_sample_set, judged
from shared.config import ModelConfig
from shared.model import Transformer
from shared.sampling import SamplingConfig
from shared.tokenizer import Tokenizer

TOKENIZER = Tokenizer.byte()  # EOS 256, pad 257
LENGTH, COUNT = 12, 3


def always_eos(vocab_size: int) -> Transformer:
    """A model whose every position predicts EOS, whatever it reads: every token embeds to the
    same vector, attention and feed-forward add nothing, and only EOS's output row is set."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=vocab_size,
        dim=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        hidden_dim=24,
        max_seq_len=32,
    )
    model = Transformer(config).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.wo.weight.zero_()
            layer.feed_forward.w2.weight.zero_()
        model.tok_embeddings.weight.fill_(1.0)
        model.output.weight.zero_()
        model.output.weight[TOKENIZER.eos_id] = 10.0
    return model


def test_one_eos_policy_gives_equal_lengths_for_ar_and_diffusion():
    ar = ARGenerator(always_eos(TOKENIZER.vocab_size), TOKENIZER)
    drawn_ar = ar_sample_set(ar, COUNT, LENGTH, SamplingConfig(), seed=0)
    state = {"objective": "mdm", "train_config": {"schedule": "linear", "seq_len": 32}}
    mdm = DiffusionGenerator(always_eos(TOKENIZER.vocab_size + 1), TOKENIZER, state)
    drawn_mdm = diffusion_sample_set(mdm, SamplerConfig(Ancestral(LENGTH)), COUNT, LENGTH, 0)
    assert drawn_ar.lengths == drawn_mdm.lengths == [0] * COUNT
    assert drawn_ar.texts == drawn_mdm.texts == [""] * COUNT
    # the AR spent one evaluation per sample (its EOS), the canvas sampler all its steps
    assert drawn_ar.nfe_per_sample == [1] * COUNT and drawn_ar.tokens_per_forward == 0.0
    assert drawn_mdm.nfe_per_sample == [drawn_mdm.nfe] * COUNT and drawn_mdm.nfe > 0
    # run through EOS (the main job's old AR policy), the AR's samples were whole rows of EOS
    config = GenerationConfig(max_new_tokens=LENGTH, stop_on_eos=False)
    through = ar.generate([[TOKENIZER.eos_id]] * COUNT, config, seed=0)
    assert [len(row) for row in through.tokens] == [LENGTH] * COUNT


class FixedJudge:
    """Scores text by its length: a sample of n characters gets n judge tokens at a rate of
    n nats each (so long samples are judged worse)."""

    identity = "fixed"

    def score(self, texts):
        tokens = [len(text) for text in texts]
        return JudgeScore(
            sum(t * t for t in tokens), sum(tokens), [float(t) for t in tokens], tokens
        )


def test_judged_perplexity_is_token_weighted():
    row = judged(FixedJudge(), ["ab", "abcdef", ""], [[1, 2], [1, 2, 3, 4, 5, 6], []])
    # the empty sample is judged as one space: 1 token at 1 nat
    assert row["judge_tokens"] == 2 + 6 + 1 and row["judge_nats"] == 4 + 36 + 1
    assert row["judge_ppl"] == pytest.approx(math.exp(41 / 9))  # not exp(mean of 2, 6, 1)
    assert row["mean_length"] == pytest.approx(8 / 3) and row["samples"] == 3
    low, high = row["judge_ppl_ci95"]
    value, log_low, log_high = log_perplexity_interval([4, 36, 1], [2, 6, 1])
    assert value == pytest.approx(41 / 9)
    assert (low, high) == pytest.approx((math.exp(log_low), math.exp(log_high)))
    assert log_perplexity_interval([4.0], [2]) is None


def test_held_out_documents_start_after_a_boundary_and_stop_at_eos():
    eos, pad, bos = 9, 8, 7
    rows = np.array(
        [
            [bos, 1, 2, eos, 3, 4, 5],
            [bos, 6, eos, eos, 1, 1, 1],  # a document running on from the row before
            [bos, 2, 3, pad, 4, pad, pad],  # padding ends a document too
        ]
    )
    documents = held_out_documents(rows, eos, pad, count=10, length=3)
    assert documents == [[1, 2], [3, 4, 5], [1, 1, 1], [4]]
    assert held_out_documents(rows, eos, pad, count=2, length=3) == [[1, 2], [3, 4, 5]]


def test_tokens_per_forward_is_valid_tokens_over_evaluations_summed_over_samples():
    canvas = SampleSet(["abc", "a"], [[1, 2, 3], [1]], nfe=2, seconds=0.0)
    assert canvas.tokens_per_forward == 4 / (2 + 2)  # every row took the canvas's 2
    ar = SampleSet(["abc", "a"], [[1, 2, 3], [1]], nfe=4, seconds=0.0, sample_nfe=[4, 2])
    assert ar.tokens_per_forward == 4 / 6  # each row's tokens and its EOS, one each
    assert ar.record()["tpf"] == 4 / 6 and ar.record()["nfe_per_sample"] == 3
    assert SampleSet([], [], nfe=0, seconds=0.0).tokens_per_forward is None
