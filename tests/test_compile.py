"""``--compile``: the compiled model computes the same losses as the eager one, trains, writes
the same checkpoints; where the compiler does not work, "on" refuses in one line and "auto" falls
back to eager, saying so once."""

import pytest
import torch

from shared.errors import ResourceUnavailableError
from shared.model import Transformer
from shared.objective import build_objective
from shared.training import new_run, setup
from shared.training.cli import train_from_argv


@pytest.fixture(scope="module")  # one worker runs the module: torch.compile warms up once
def compiler():
    problem = setup.compiler_problem()
    if problem is not None:
        pytest.skip(f"torch.compile does not work on this machine: {problem}")


@pytest.mark.slow
def test_compiled_and_eager_losses_and_gradients_agree(compiler):
    config = new_run("tiny").model.with_vocab(260)
    torch.manual_seed(0)
    eager = Transformer(config)
    compiled = Transformer(config)
    compiled.load_state_dict(eager.state_dict())
    assert setup.compile_model(compiled, "on", "single process", print)
    tokens = torch.randint(1, 259, (4, 32), generator=torch.Generator().manual_seed(1))
    for objective, options in (("ar", {}), ("mdm", {"mask_id": 259})):
        loss_fn = build_objective(objective, pad_id=0, **options)
        noise = loss_fn.sample_noise(4, 32, torch.Generator().manual_seed(2))
        a = loss_fn.loss(eager, tokens, noise).nats
        b = loss_fn.loss(compiled, tokens, noise).nats
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), objective
        a.sum().backward()
        b.sum().backward()
        for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), (objective, name)
            p.grad = q.grad = None
    # compiled in place: the parameter names, so the checkpoints, are unchanged
    assert list(compiled.state_dict()) == list(eager.state_dict())


@pytest.mark.slow
def test_a_compiled_run_trains_and_records_it(tmp_path, compiler):
    args = ["--preset", "tiny", "--max-steps", "2", "--eval-every", "2", "--out", str(tmp_path)]
    summary = train_from_argv([*args, "--compile", "on", "--cache-dir", str(tmp_path / "c")])
    assert summary["compiled"] is True and summary["step"] == 2


def test_without_a_compiler_on_refuses_and_auto_falls_back(monkeypatch):
    monkeypatch.setattr(setup, "compiler_problem", lambda: "CalledProcessError: no cc")
    model = Transformer(new_run("tiny").model.with_vocab(260))
    with pytest.raises(ResourceUnavailableError, match="--compile on: torch.compile does not"):
        setup.compile_model(model, "on", "single process", print)
    said = []
    assert setup.compile_model(model, "auto", "single process", said.append) is False
    assert len(said) == 1 and "training eagerly" in said[0]
    assert setup.compile_model(model, "off", "single process", said.append) is False
