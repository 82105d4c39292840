"""Sample text from an AR checkpoint.

    python -m arlm.sample runs/demo-ar --prompt "In the beginning" --max-new-tokens 60
    python -m arlm.sample runs/demo-ar --prompt "And God said" --prompt "Blessed" \\
        --temperature 0.8 --top-p 0.95 --seed 1 --stop "."
    python -m arlm.sample runs/demo-ar --prompts-file prompts.txt --temperature 0 --stream

Every prompt becomes ``<|endoftext|>`` + its tokens (how training rows start); an empty prompt
(``--prompt ""``) samples unconditionally. All prompts run as one batch. With ``--stream`` the
text is printed as it is produced, one prompt after the other (each its own batch of one, so a
seeded sample can differ from the batched run's). User errors exit with status 2 and one line.
"""

from __future__ import annotations

import argparse
import sys

import torch

from arlm.generate import ARGenerator, GenerationConfig, GenerationResult
from shared.cli_args import (
    CommandParser,
    DefaultsHelpFormatter,
    device_argument,
    fitting_length,
    positive_argument,
    read_text_file,
    seed_argument,
    set_threads,
    utf8_argument,
)
from shared.errors import report_user_errors
from shared.sampling import SamplingConfig


def build_parser(prog: str = "python -m arlm.sample") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description="Generate text from an autoregressive checkpoint.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("checkpoint", help="checkpoint directory or run directory (newest)")
    parser.add_argument(
        "--prompt", action="append", default=[], help="a prompt (repeat for a batch)"
    )
    parser.add_argument("--prompts-file", help="a text file with one prompt per line")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens to generate (default: 64, or what fits the model's context)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    parser.add_argument("--seed", type=seed_argument, default=0)
    parser.add_argument(
        "--stop", action="append", default=[], help="stop string (repeat for several)"
    )
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    parser.add_argument("--no-cache", action="store_true", help="recompute every step")
    parser.add_argument("--stream", action="store_true", help="print text as it is produced")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    return parser


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = [utf8_argument(prompt, "--prompt") for prompt in args.prompt]
    if args.prompts_file:
        prompts += read_text_file(args.prompts_file, "--prompts-file").splitlines()
    if not prompts:
        raise ValueError(
            "no prompts: give --prompt TEXT or --prompts-file FILE "
            "(--prompt '' samples unconditionally)"
        )
    return prompts


def generation_config(args: argparse.Namespace, max_new_tokens: int) -> GenerationConfig:
    sampling = SamplingConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
    )
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        stop_on_eos=not args.ignore_eos,
        stop_strings=tuple(args.stop),
        use_cache=not args.no_cache,
    ).validate()


def stats_line(result: GenerationResult, row: int) -> str:
    return (
        f"[{len(result.tokens[row])} tokens, prompt {result.prompt_lengths[row]} tokens, "
        f"finish: {result.finish_reasons[row]}]"
    )


def batch_stats(result: GenerationResult) -> str:
    return (
        f"{result.new_tokens} tokens in {result.total_s:.3f} s ({result.tokens_per_s:.1f} tok/s; "
        f"prefill {result.prefill_s * 1e3:.1f} ms, decode {result.decode_tokens_per_s:.1f} tok/s, "
        f"{result.forward_passes} forward passes)"
    )


def run(args: argparse.Namespace) -> None:
    prompts = read_prompts(args)
    set_threads(args.threads)
    if args.max_new_tokens is not None:
        positive_argument(args.max_new_tokens, "--max-new-tokens")
    engine = ARGenerator.from_checkpoint(args.checkpoint, device=device_argument(args.device))
    longest = max(len(engine.tokenizer.encode(prompt)) for prompt in prompts)
    context = engine.model.config.max_seq_len
    config = generation_config(
        args, fitting_length(args.max_new_tokens, context, longest, "--max-new-tokens")
    )
    generator = torch.Generator().manual_seed(args.seed)
    if not args.stream:
        result = engine.generate(prompts, config, generator=generator)
        for row, prompt in enumerate(prompts):
            print(f"=== sample {row} {stats_line(result, row)}")
            print(prompt + result.texts[row])
        print(batch_stats(result))
        return
    for row, prompt in enumerate(prompts):
        print(f"=== sample {row}")
        print(prompt, end="", flush=True)
        stream = engine.stream([prompt], config, generator=generator)
        for step in stream:
            print(step.texts[0], end="", flush=True)
        print()
        print(stats_line(stream.result, 0), batch_stats(stream.result))


def main(argv: list[str] | None = None, prog: str = "python -m arlm.sample") -> int:
    args = build_parser(prog).parse_args(argv)
    return report_user_errors(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
