"""Report writing: JSON round trip, protocol refusal, plots embedded."""

import json
import math
import re

import pytest

from eval.report import ProtocolMismatch, Report, Table, frontier_figure

PROTOCOL = {
    "corpus_fingerprint": "abc",
    "protocol": "packed",
    "seq_len": 128,
    "tokenizer": {"kind": "bpe", "fingerprint": "t1", "vocab_size": 2048},
}


def estimate(value: float, kind: str) -> dict:
    return {
        "kind": kind,
        "nats_per_token": value,
        "nats_per_token_ci95": [value - 0.1, value + 0.1],
        "perplexity": 2.718**value,
        "bits_per_byte": value / 3,
        "tokens": 1000,
        "protocol": PROTOCOL,
    }


def test_report_round_trips_and_embeds_its_plots(tmp_path):
    report = Report("AR vs MDM", tmp_path, config={"preset": "smoke"}, seeds={"train": 0})
    report.text("Some words.")
    report.likelihood_table(
        "Validation", {"ar": estimate(3.3, "exact nll"), "mdm": estimate(4.0, "nelbo")}
    )
    report.table(Table("Speed", ["model", "tokens/s"], [["ar", 100.0], ["mdm", 95.5]]))
    figure = frontier_figure(
        {"ancestral": [(8, 50.0), (32, 40.0)], "ar": [(64, 20.0)]},
        xlabel="NFE",
        ylabel="gen ppl",
        title="frontier",
        logx=True,
    )
    report.plot("frontier", figure, "Generative perplexity vs NFE")
    paths = report.write()
    data = json.loads(paths["json"].read_text())
    assert data == json.loads(json.dumps(report.to_json() | {"provenance": data["provenance"]}))
    assert data["results"]["likelihood"]["Validation"]["ar"]["nats_per_token"] == 3.3
    assert data["provenance"]["versions"]["torch"] and data["provenance"]["seeds"] == {"train": 0}
    markdown = paths["markdown"].read_text()
    embedded = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert embedded == ["frontier.png"] and (tmp_path / "frontier.png").stat().st_size > 1000
    assert "| ar | exact nll | 3.3 |" in markdown


def test_mixing_protocols_is_refused_with_the_difference_named(tmp_path):
    report = Report("x", tmp_path)
    padded = estimate(4.0, "nelbo") | {"protocol": PROTOCOL | {"protocol": "padded"}}
    with pytest.raises(ProtocolMismatch, match="protocol: ar='packed' vs mdm='padded'"):
        report.likelihood_table("Validation", {"ar": estimate(3.3, "nll"), "mdm": padded})
    other_tokenizer = estimate(4.0, "nelbo") | {
        "protocol": PROTOCOL | {"tokenizer": {"fingerprint": "t2"}}
    }
    with pytest.raises(ProtocolMismatch, match="tokenizer"):
        report.likelihood_table("V", {"ar": estimate(3.3, "nll"), "mdm": other_tokenizer})


def test_report_json_is_strict_with_the_reason_of_each_null(tmp_path):
    """RFC 8259 has no NaN or Infinity: each becomes null, and ``non_finite`` says where and what
    it was; the markdown still shows the number."""
    report = Report("Distances", tmp_path)
    report.results.update(
        {"kl": {"trained": [0.5, math.inf], "nan": math.nan}, "low": -math.inf, "tv": 0.25}
    )
    report.table(Table("KL", ["setting", "KL(q||p)"], [["mdm", math.inf]]))
    paths = report.write()
    text = paths["json"].read_text()

    def refuse(word: str) -> None:
        raise AssertionError(f"report.json holds {word}")

    data = json.loads(text, parse_constant=refuse)
    results = data["results"]
    assert results["kl"] == {"trained": [0.5, None], "nan": None} and results["low"] is None
    assert results["tv"] == 0.25 and data["tables"][0]["rows"] == [["mdm", None]]
    assert data["non_finite"] == {
        "results.kl.trained[1]": "inf",
        "results.kl.nan": "nan",
        "results.low": "-inf",
        "tables[0].rows[0][1]": "inf",
    }
    assert "| mdm | inf |" in paths["markdown"].read_text()
