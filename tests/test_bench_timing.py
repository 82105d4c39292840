"""bench/diffusion_sampling.py times its samplers with eval.speed.throughput.measure: every run
alternates in the same rounds, a row is its fastest round and the output of its last run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import diffusion_sampling  # noqa: E402


def test_every_run_is_timed_in_the_same_rounds_and_keeps_its_output():
    calls: list[str] = []

    def run(name: str):
        def once() -> str:
            calls.append(name)
            return f"{name} output {calls.count(name)}"

        return once

    timed = diffusion_sampling.fastest_rounds({"a": run("a"), "b": run("b")}, 8, repeats=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]  # no warm-up, the order rotated each round
    assert [name for name in timed] == ["a", "b"]
    assert timed["a"][1] == "a output 3" and timed["b"][1] == "b output 3"
    assert all(seconds > 0 for seconds, _ in timed.values())
