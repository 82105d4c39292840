"""Likelihood estimates of a checkpoint in nats/token and bits per byte, with their
Monte-Carlo error: AR exact NLL, MDM NELBO, the MDM's exact left-to-right chain rule, and
conditional likelihoods; the ``python -m eval.likelihood`` command line.

Diffusion noise comes from ``shared.validation.noise_generator`` seeded by (seed, row), so two
evaluations of one checkpoint see identical noise.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from shared.checkpoint import load_model_from_checkpoint
from shared.cli_args import CommandParser, DefaultsHelpFormatter, seed_argument, writable_file
from shared.data.corpus import load_corpus
from shared.data.rows import protocol_record, tokenize_corpus
from shared.door import write_atomic
from shared.errors import ConfigError, report_user_errors
from shared.files import cache_folder
from shared.objective import Objective, loss_positions, objective_for_run
from shared.validation import noise_generator

MAX_DRAWS = 1 << 12  # noise draws per row, which go through the model as one batch

# ---------------------------------------------------------------- estimates with uncertainty


@dataclass
class Estimate:
    """A likelihood over some text: total nats, how many tokens and UTF-8 bytes it covers, and
    the Monte-Carlo standard error of the total (0 for exact values). The error is the sampling
    error of the estimator on *this* text, not the uncertainty from the choice of text."""

    nats: float
    tokens: int
    bytes: int
    stderr: float = 0.0
    kind: str = "exact nll"
    row_nats: list[float] = field(default_factory=list)  # per row, in input order

    def add(self, row_nats: list[float], nats: float, tokens: int, n_bytes: int) -> None:
        """Count one batch: its per-row nats, their total, its scored tokens and their bytes."""
        self.row_nats += row_nats
        self.nats += nats
        self.tokens += tokens
        self.bytes += n_bytes

    @property
    def nats_per_token(self) -> float:
        return self.nats / max(self.tokens, 1)

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / max(self.bytes, 1)

    def as_dict(self) -> dict[str, float | str]:
        per_token_error = self.stderr / max(self.tokens, 1)
        return {
            "kind": self.kind,
            "nats_per_token": self.nats_per_token,
            "nats_per_token_stderr": per_token_error,
            "nats_per_token_ci95": [
                self.nats_per_token - 1.96 * per_token_error,
                self.nats_per_token + 1.96 * per_token_error,
            ],
            "perplexity": math.exp(min(self.nats_per_token, 700.0)),
            "bits_per_byte": self.bits_per_byte,
            "bits_per_byte_stderr": self.stderr / math.log(2) / max(self.bytes, 1),
            "tokens": self.tokens,
            "bytes": self.bytes,
        }


def _batches(rows: np.ndarray | torch.Tensor, batch_size: int, desc: str = "rows"):
    """(first row index, rows) per batch, with a progress bar on a terminal."""
    with tqdm(total=len(rows), desc=desc, unit="row", leave=False, disable=None) as bar:
        for start in range(0, len(rows), batch_size):
            batch = torch.as_tensor(rows[start : start + batch_size], dtype=torch.long)
            yield start, batch
            bar.update(len(batch))


def _bytes_of(tokens: torch.Tensor, scored: torch.Tensor, token_bytes: np.ndarray) -> int:
    return int(torch.as_tensor(token_bytes)[tokens[scored]].sum())


@torch.no_grad()
def ar_nll(
    model: nn.Module,
    objective: Objective,
    rows: np.ndarray,
    token_bytes: np.ndarray,
    *,
    batch_size: int,
    device: torch.device | str = "cpu",
    scored: torch.Tensor | None = None,
) -> Estimate:
    """Exact negative log-likelihood of an autoregressive model over ``rows``."""
    total = Estimate(0.0, 0, 0, kind="exact nll (autoregressive)")
    for start, tokens in _batches(rows, batch_size):
        mask = _scored(objective, tokens, scored, start)
        out = objective.loss(model, tokens.to(device), {}, mask.to(device))
        total.add(
            out.row_nats.double().cpu().tolist(),
            float(out.nats),
            int(out.n_tokens),
            _bytes_of(tokens, mask, token_bytes),
        )
    return total


def _scored(objective, tokens: torch.Tensor, scored: torch.Tensor | None, start: int):
    if scored is None:
        return loss_positions(tokens, objective.pad_id)
    return torch.as_tensor(scored[start : start + len(tokens)], dtype=torch.bool)


@torch.no_grad()
def mdm_nelbo(
    model: nn.Module,
    objective,
    rows: np.ndarray,
    token_bytes: np.ndarray,
    *,
    samples: int,
    batch_size: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    scored: torch.Tensor | None = None,
) -> Estimate:
    """Monte-Carlo NELBO of a masked diffusion model: ``samples`` noise draws per row, with t
    stratified across each row's draws (or k, for the count estimator).

    The standard error combines each row's sample variance of its per-draw NELBO divided by the
    number of draws; with stratified draws this over-estimates the true error, so the interval is
    conservative.
    """
    if samples < 2:
        raise ValueError(f"samples={samples} must be >= 2 to estimate a standard error")
    total = Estimate(0.0, 0, 0, kind=f"nelbo ({objective.estimator} estimator, {samples} samples)")
    variance = 0.0
    rows_per_batch = max(1, batch_size // samples)
    for start, tokens in _batches(rows, rows_per_batch, "NELBO"):
        mask = _scored(objective, tokens, scored, start)
        noise = objective.repeated_noise(
            len(tokens), samples, tokens.shape[1], noise_generator(seed, start)
        )
        repeated = tokens.repeat_interleave(samples, dim=0).to(device)
        # Without an explicit selection the objective picks what to noise (padding too, under
        # the padded protocol); ``mask`` is then only the token count.
        chosen = None if scored is None else mask.repeat_interleave(samples, dim=0).to(device)
        out = objective.loss(model, repeated, noise, chosen)
        per_draw = out.row_nats.double().view(len(tokens), samples).cpu()
        row_means = per_draw.mean(1)
        total.add(
            row_means.tolist(),
            float(row_means.sum()),
            int(mask.sum()),
            _bytes_of(tokens, mask, token_bytes),
        )
        variance += float((per_draw.var(1, unbiased=True) / samples).sum())
    total.stderr = math.sqrt(variance)
    return total


@torch.no_grad()
def mdm_chain_rule_nll(
    model: nn.Module,
    objective,
    rows: np.ndarray,
    token_bytes: np.ndarray,
    *,
    batch_size: int,
    device: torch.device | str = "cpu",
    scored: torch.Tensor | None = None,
) -> Estimate:
    """Exact log-likelihood of the masked diffusion model used as a left-to-right generator.

    Start with every scored position masked; reveal them left to right, each time scoring the
    true token under the model's prediction at that position (one forward per position). This
    is the exact probability of the text under a well-defined model (the MDM decoding one token
    per step in a fixed order), so it is a likelihood, not a bound; it is not the likelihood of
    the model's own (random-order) sampler, which the NELBO bounds.
    """
    mask_id = objective.mask_id
    total = Estimate(0.0, 0, 0, kind="exact nll (mdm, left-to-right unmasking)")
    for start, tokens in _batches(rows, batch_size, "left-to-right NLL"):
        counted = _scored(objective, tokens, scored, start)
        revealed = counted if scored is not None else _noised_positions(objective, tokens)
        tokens = tokens.to(device)
        row_nats = -left_to_right_log_likelihood(model, tokens, revealed.to(device), mask_id)
        total.add(
            row_nats.cpu().tolist(),
            float(row_nats.sum()),
            int(counted.sum()),
            _bytes_of(tokens.cpu(), counted, token_bytes),
        )
    return total


def left_to_right_log_likelihood(
    model, tokens: torch.Tensor, revealed: torch.Tensor, mask_id: int, key_valid=None
) -> torch.Tensor:
    """Each row's exact log-likelihood (float64) of its ``revealed`` positions under a masked
    diffusion model: all of them masked, then revealed left to right, each scored under the
    model's prediction at that step. ``key_valid`` keeps padding out of attention, so a row's
    score does not depend on its batch."""
    padding = {} if key_valid is None else {"key_valid": key_valid}  # exact tables take none
    state = torch.where(revealed, torch.full_like(tokens, mask_id), tokens)
    total = torch.zeros(len(tokens), dtype=torch.float64, device=tokens.device)
    for position in range(tokens.shape[1]):
        active = revealed[:, position]
        if not active.any():
            continue
        select = torch.zeros_like(revealed)
        select[:, position] = active
        logits = model(state, attention="bidirectional", output_mask=select, **padding)
        log_probs = torch.log_softmax(logits[:, :mask_id].double(), dim=-1)
        total[active] += log_probs.gather(1, tokens[active, position][:, None])[:, 0]
        state[active, position] = tokens[active, position]
    return total


def _noised_positions(objective, tokens: torch.Tensor) -> torch.Tensor:
    """Positions a masked diffusion objective generates (padding too under the padded
    protocol), so the chain rule covers the same events as the NELBO."""
    chooser = getattr(objective, "noised_positions", None)
    return chooser(tokens) if chooser else loss_positions(tokens, objective.pad_id)


def continuation_rows(
    prompts: list[list[int]], continuations: list[list[int]], *, bos_id: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [BOS] + prompt + continuation, right-padded, and the mask of continuation positions
    (the only positions scored; the prompt stays visible to both objectives)."""
    if len(prompts) != len(continuations):
        raise ValueError(
            f"got {len(prompts)} prompts but {len(continuations)} continuations; pair them up"
        )
    if any(len(c) == 0 for c in continuations):
        raise ValueError("every continuation needs at least one token")
    length = max(1 + len(p) + len(c) for p, c in zip(prompts, continuations))
    rows = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    scored = torch.zeros((len(prompts), length), dtype=torch.bool)
    for i, (prompt, continuation) in enumerate(zip(prompts, continuations)):
        ids = [bos_id, *prompt, *continuation]
        rows[i, : len(ids)] = torch.tensor(ids)
        scored[i, 1 + len(prompt) : len(ids)] = True
    return rows, scored


# ---------------------------------------------------------------- command line


def evaluate_checkpoint(
    checkpoint: str,
    *,
    dataset: str | None = None,
    val_dataset: str | None = None,
    split: str = "validation",
    samples: int = 8,
    estimator: str | None = None,
    chain_rule_rows: int = 0,
    max_rows: int = 0,
    batch_size: int = 16,
    seed: int = 0,
    cache_dir: str | None = None,
) -> dict:
    """Likelihood of a checkpoint on a corpus split, under the checkpoint's own data protocol
    (tokenizer, packed/padded, sequence length), with the protocol recorded beside the numbers.
    ``val_dataset``: a corpus evaluated whole as the validation split (a published validation
    file, say), where ``dataset`` holds part of a corpus out."""

    model, tokenizer, state = load_model_from_checkpoint(Path(checkpoint))
    config = state["train_config"]
    check_evaluation_settings(
        split=split,
        samples=samples,
        chain_rule_rows=chain_rule_rows,
        max_rows=max_rows,
        batch_size=batch_size,
        dataset=dataset,
        val_dataset=val_dataset,
    )
    corpus = evaluation_corpus(config, dataset, val_dataset)
    protocol = {"protocol": config["protocol"], "seq_len": config["seq_len"]}
    cache = cache_folder(cache_dir)
    splits = tokenize_corpus(corpus, tokenizer, **protocol, cache_dir=cache)
    rows = splits[split].tokens[: max_rows or None]
    name = state["objective"]
    objective = objective_for_run(
        name, config, tokenizer, **({"estimator": estimator} if estimator else {})
    )
    return {
        "checkpoint": str(checkpoint),
        "objective": name,
        "step": state["step"],
        "split": split,
        "rows": len(rows),
        "protocol": protocol_record(corpus, tokenizer, splits, **protocol),
        "estimates": estimates(
            model,
            objective,
            rows,
            tokenizer.token_bytes(),
            samples=samples,
            chain_rule_rows=chain_rule_rows,
            batch_size=batch_size,
            seed=seed,
        ),
    }


def check_evaluation_settings(
    *,
    split: str,
    samples: int,
    chain_rule_rows: int,
    max_rows: int,
    batch_size: int,
    dataset: str | None,
    val_dataset: str | None,
) -> None:
    """Refuse settings ``evaluate_checkpoint`` cannot honour, each with what to give instead."""
    if split not in ("train", "validation"):
        raise ValueError(f"split={split!r} must be 'train' or 'validation'")
    if samples < 2:
        raise ValueError(f"samples={samples} must be >= 2 (a standard error needs two draws)")
    if samples > MAX_DRAWS:
        raise ValueError(f"samples={samples} is more than {MAX_DRAWS:,} (draws are one batch)")
    if chain_rule_rows < 0 or max_rows < 0 or batch_size < 1:
        raise ValueError(
            f"chain_rule_rows={chain_rule_rows} and max_rows={max_rows} must be >= 0 and "
            f"batch_size={batch_size} >= 1"
        )
    if val_dataset and (dataset or split != "validation"):
        raise ValueError("val_dataset is evaluated whole as the validation split; give it alone")


def evaluation_corpus(config: dict, dataset: str | None, val_dataset: str | None):
    """The corpus to evaluate: ``val_dataset`` whole as the validation split, else ``dataset``
    (its own held-out part), else the checkpoint's training corpus with its validation split."""
    if val_dataset:
        return load_corpus(val_dataset, text_field=config["text_field"], val_dataset=val_dataset)
    return load_corpus(
        dataset or config["dataset"],
        text_field=config["text_field"],
        val_dataset=None if dataset else config["val_dataset"] or None,
    )


def estimates(
    model: nn.Module,
    objective: Objective,
    rows: np.ndarray,
    token_bytes: np.ndarray,
    *,
    samples: int,
    chain_rule_rows: int,
    batch_size: int,
    seed: int,
) -> dict[str, dict]:
    """The objective's estimates over ``rows``: the AR's exact NLL, or a diffusion model's
    NELBO and, for an MDM with ``chain_rule_rows``, its exact left-to-right NLL beside the NELBO
    of the same rows."""
    if objective.name == "ar":
        return {"nll": ar_nll(model, objective, rows, token_bytes, batch_size=batch_size).as_dict()}

    def nelbo(subset: np.ndarray) -> dict:
        return mdm_nelbo(
            model,
            objective,
            subset,
            token_bytes,
            samples=samples,
            batch_size=batch_size,
            seed=seed,
        ).as_dict()

    found = {"nelbo": nelbo(rows)}
    if chain_rule_rows and objective.name == "mdm":  # bidirectional chain rule: MDM only
        subset = rows[:chain_rule_rows]
        found["chain_rule_nll"] = mdm_chain_rule_nll(
            model, objective, subset, token_bytes, batch_size=batch_size
        ).as_dict()
        found["nelbo_on_chain_rule_rows"] = nelbo(subset)
    return found


def main(argv: list[str] | None = None) -> int:

    parser = CommandParser(
        description="Likelihood of a checkpoint: exact NLL (AR) or Monte-Carlo NELBO with its "
        "standard error (MDM), optionally the MDM's exact left-to-right chain-rule NLL.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("checkpoint", help="run or checkpoint directory")
    parser.add_argument(
        "--dataset", default=None, help="corpus to evaluate (default: the checkpoint's own)"
    )
    parser.add_argument(
        "--val-dataset",
        default=None,
        help="a corpus to evaluate whole as the validation split (e.g. a published validation "
        "file), instead of the part --dataset holds out",
    )
    parser.add_argument("--split", default="validation", choices=["train", "validation"])
    parser.add_argument("--samples", type=int, default=8, help="MDM noise draws per row")
    parser.add_argument(
        "--estimator",
        choices=["time", "count"],
        default=None,
        help="MDM estimator (default: the one it was trained with)",
    )
    parser.add_argument(
        "--chain-rule-rows",
        type=int,
        default=0,
        help="also compute the MDM's exact left-to-right NLL on this many rows "
        "(one forward per token)",
    )
    parser.add_argument("--max-rows", type=int, default=0, help="evaluate only the first rows")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=seed_argument, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)

    return report_user_errors(lambda: report(args))


def report(args: argparse.Namespace) -> None:
    """Evaluate, print one line per estimate, and write the JSON file if asked."""
    if args.json:
        writable_file(args.json, "--json")  # before minutes of work, not after
    results = evaluate_checkpoint(
        args.checkpoint,
        dataset=args.dataset,
        val_dataset=args.val_dataset,
        split=args.split,
        samples=args.samples,
        estimator=args.estimator,
        chain_rule_rows=args.chain_rule_rows,
        max_rows=args.max_rows,
        batch_size=args.batch_size,
        seed=args.seed,
        cache_dir=args.cache_dir,
    )
    if not results["protocol"]["tokenizer"]["bytes_exact"]:
        print("bits/byte below are approximate: this tokenizer normalizes text (compare nats)")
    for label, values in results["estimates"].items():
        low, high = values["nats_per_token_ci95"]
        print(
            f"{label:26s} {values['nats_per_token']:.4f} nats/token "
            f"[{low:.4f}, {high:.4f}]  {values['bits_per_byte']:.4f} bits/byte  "
            f"({values['kind']}, {values['tokens']} tokens)"
        )
    if args.json:
        try:
            write_atomic(Path(args.json), json.dumps(results, indent=2))
        except OSError as error:
            raise ConfigError(f"--json {args.json} could not be written: {error}") from None


if __name__ == "__main__":
    raise SystemExit(main())
