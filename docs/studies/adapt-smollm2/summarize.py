"""Tables and the figure of the SmolLM2 adaptation study from its run folders.

    python docs/studies/adapt-smollm2/summarize.py runs/adapt-smollm2 docs/studies/adapt-smollm2

Reads each MDM run's periodic validations (``metrics.jsonl``, 16 rows) and its final validation
on the whole split (``final.json``), and the AR model's exact NLL on the same split
(``ar-likelihood.json``); writes ``results.json`` and ``curves.png``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = ("adapted-shifted", "adapted-unshifted", "scratch")


def evaluations(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "eval"]


def main(runs: Path, out: Path) -> None:
    results: dict = {"runs": {}}
    for name in RUNS:
        final = json.loads((runs / name / "final.json").read_text())
        curve = [
            {"step": r["step"], "val_nats_per_token": r["val_nats_per_token"]}
            for r in evaluations(runs / name)
        ]
        first_train = next(
            json.loads(line)
            for line in (runs / name / "metrics.jsonl").read_text().splitlines()
            if json.loads(line).get("kind") == "train"
        )
        results["runs"][name] = {
            "final_nelbo": final["val_nats_per_token"],
            "final_nelbo_se": final.get("val_nats_per_token_se"),
            "final_bits_per_byte": final["val_bpb"],
            "val_tokens": final["val_tokens"],
            "steps": final["step"],
            "tokens_seen": final["tokens_seen"],
            "train_flops": final["tokens_seen"] * final["flops_per_token"],
            "first_logged_train_loss": first_train["loss"],
            "curve": curve,
        }
    ar = json.loads((runs / "ar-likelihood.json").read_text())["estimates"]["nll"]
    results["ar"] = {
        "nll": ar["nats_per_token"],
        "bits_per_byte": ar["bits_per_byte"],
        "tokens": ar["tokens"],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in RUNS:
        curve = results["runs"][name]["curve"]
        ax.plot([p["step"] for p in curve], [p["val_nats_per_token"] for p in curve], "o-",
                label=f"MDM {name} (16 rows)")  # fmt: skip
        run = results["runs"][name]
        ax.plot([run["steps"]], [run["final_nelbo"]], "k*", markersize=9)
    ax.axhline(results["ar"]["nll"], color="gray", ls="--", label="AR (SmolLM2) exact NLL")
    ax.set_xlabel("training step (8 x 128 tokens)")
    ax.set_ylabel("validation nats/token (MDM: NELBO)")
    ax.set_title("SmolLM2-135M into an MDM on KJV, CPU budget (stars: whole split)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))
    for name, run in results["runs"].items():
        print(name, {k: v for k, v in run.items() if k != "curve"})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
