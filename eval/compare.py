"""Train an AR and an MDM model from the same preset and put their numbers side by side.

    python -m eval.compare --preset demo --out runs/demo [--force] [training overrides...]

Both runs share the preset, the corpus, the tokenizer, the seed and the token budget; only the
objective differs. A finished run is reused on a rerun unless ``--force`` is given. The summary
is printed and written to ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

OBJECTIVES = ("ar", "mdm")


def run_one(
    objective: str, preset: str, out: Path, extra: list[str], force: bool
) -> dict[str, Any]:
    import train

    final = out / "final.json"
    if final.exists() and not force:
        summary = json.loads(final.read_text())
        if summary.get("finished"):
            print(f"[{objective}] reusing finished run in {out} (use --force to retrain)")
            return summary
    if force and out.exists():
        shutil.rmtree(out)
    argv = ["--objective", objective, "--preset", preset, "--out", str(out), *extra]
    # Continue an interrupted run instead of starting over.
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        argv = ["--resume", str(out), *extra]
    return train.train(argv)


def format_table(results: dict[str, dict[str, Any]]) -> str:
    ar, mdm = results["ar"], results["mdm"]
    lines = [
        f"{'':28s}{'AR':>14s}{'MDM':>14s}",
        f"{'validation metric':28s}{'NLL (exact)':>14s}{'NELBO (bound)':>14s}",
        f"{'nats / token':28s}{ar['val_nats_per_token']:14.4f}{mdm['val_nats_per_token']:14.4f}",
        f"{'perplexity':28s}{ar['val_ppl']:14.2f}{mdm['val_ppl']:14.2f}",
        f"{'bits / byte':28s}{ar['val_bpb']:14.4f}{mdm['val_bpb']:14.4f}",
        f"{'train tokens / s':28s}{ar['train_tokens_per_s']:14,.0f}"
        f"{mdm['train_tokens_per_s']:14,.0f}",
        f"{'tokens seen':28s}{ar['tokens_seen']:14,d}{mdm['tokens_seen']:14,d}",
        f"{'parameters':28s}{ar['parameters']:14,d}{mdm['parameters']:14,d}",
    ]
    ratio = math.exp(mdm["val_nats_per_token"] - ar["val_nats_per_token"])
    lines.append(f"MDM/AR perplexity ratio: {ratio:.3f} (the MDM side is an upper bound)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--out", default=None, help="output directory (default runs/<preset>)")
    parser.add_argument("--force", action="store_true", help="retrain even if runs are finished")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out or f"runs/{args.preset}")
    from shared.config import ConfigError

    results = {}
    try:
        for objective in OBJECTIVES:
            results[objective] = run_one(objective, args.preset, out / objective, extra, args.force)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    table = format_table(results)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(results, indent=2))
    (out / "summary.txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
