"""``duolm shard-data``: tokenize a corpus once into memory-mapped token shards
(``shared.data.shards``) that ``--dataset shards:DIR`` trains on.

    duolm shard-data --data kjv --tokenizer byte --seq-len 128 --out data/kjv-byte-128
    duolm shard-data --data roneneldan/TinyStories --streaming --tokenizer gpt2 \\
        --seq-len 512 --shard-tokens 100000000 --out data/tinystories

A local corpus, ``kjv`` or a ``synthetic:`` language is read the way training reads it (its
documents in memory, its validation split held out the same way), so the shards hold exactly the
rows an in-memory run trains on. ``--streaming`` reads a Hugging Face hub dataset as a stream
(``datasets`` ``streaming=True``) and never holds it whole; offline it refuses in one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from shared.cli_args import CommandParser, positive_argument
from shared.data.corpus import load_corpus, stream_hub_documents
from shared.data.shard_writer import write_shards
from shared.errors import ConfigError, report_user_errors
from shared.files import cache_root, check_path_length
from shared.tokenizer_cache import build_tokenizer
from shared.training.run_folder import (
    RunFolderLock,
    contents,
    mark_folder,
    what_it_holds,
)
from shared.training.unfinished import removed_if_unfinished


def build_parser() -> CommandParser:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a corpus spec, as train.py's --dataset")
    parser.add_argument("--out", required=True, help="the shard folder to write (new)")
    parser.add_argument("--tokenizer", default="byte", help="byte | gpt2 | bpe | hf:NAME")
    parser.add_argument("--tokenizer-vocab-size", type=int, default=2048, help="bpe only")
    parser.add_argument("--seq-len", type=int, default=128, help="row length, BOS included")
    parser.add_argument("--protocol", default="packed", choices=["packed", "padded"])
    parser.add_argument(
        "--shard-tokens", type=int, default=100_000_000, help="tokens per shard file (at most)"
    )
    parser.add_argument("--text-field", default="text")
    parser.add_argument(
        "--streaming", action="store_true", help="read a hub dataset as a stream, never whole"
    )
    parser.add_argument("--cache-dir", default=str(cache_root()))
    return parser


def documents_of(args: argparse.Namespace) -> tuple[Iterator[tuple[str, str]], list[str] | None]:
    """((split, text) pairs, the train texts when held in memory, else None)."""
    if args.streaming:
        return stream_hub_documents(args.data, text_field=args.text_field), None
    corpus = load_corpus(args.data, text_field=args.text_field)

    def pairs() -> Iterator[tuple[str, str]]:
        yield from (("train", text) for text in corpus.train)
        yield from (("validation", text) for text in corpus.validation)

    return pairs(), corpus.train


def shard(args: argparse.Namespace) -> dict:
    check_path_length(Path(args.out), "--out")  # before the corpus is read and tokenized
    positive_argument(args.shard_tokens, "--shard-tokens")
    positive_argument(args.seq_len, "--seq-len")
    if args.streaming and args.tokenizer == "bpe":
        raise ConfigError(
            "--tokenizer bpe is trained on the whole corpus in memory; a --streaming corpus "
            "takes a tokenizer that needs no training (byte, gpt2 or hf:NAME)"
        )
    documents, train_texts = documents_of(args)
    fingerprint = None
    if train_texts is not None:
        fingerprint = load_corpus(args.data, text_field=args.text_field).fingerprint
    tokenizer = build_tokenizer(
        args.tokenizer,
        vocab_size=args.tokenizer_vocab_size,
        train_texts=train_texts,
        corpus_fingerprint=fingerprint,
        cache_dir=Path(args.cache_dir),
    )
    out = Path(args.out)
    lock = claim_shard_folder(out)
    try:
        with removed_if_unfinished(out):
            manifest = write_shards(
                out,
                documents,
                tokenizer,
                protocol=args.protocol,
                seq_len=args.seq_len,
                shard_tokens=args.shard_tokens,
                source=args.data,
            )
            mark_folder(out, "shards")
    finally:
        lock.release()
    return manifest


def claim_shard_folder(out: Path) -> RunFolderLock:
    """Lock ``out`` as every writer does (a live run's folder, a run's checkpoints, a FIFO or a
    file refuse in one line) and refuse it unless it is new or empty: shards are written only
    into a folder of their own, never among other files."""
    lock = RunFolderLock(out).acquire()
    if contents(out):
        lock.release()
        raise ConfigError(
            f"{out} already holds {what_it_holds(out)}; write the shards into a new or empty "
            "--out folder"
        )
    return lock


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def job() -> None:
        manifest = shard(args)
        train = manifest["splits"]["train"]
        validation = manifest["splits"]["validation"]
        print(
            f"wrote {len(train['shards'])} train shard(s) ({train['n_rows']} rows) and "
            f"{len(validation['shards'])} validation shard(s) ({validation['n_rows']} rows) of "
            f"{manifest['seq_len']} tokens, {manifest['dtype']}, to {args.out}"
        )

    return report_user_errors(job)


if __name__ == "__main__":
    sys.exit(main())
