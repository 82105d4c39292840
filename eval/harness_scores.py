"""The tensor side of the lm-eval model (eval/harness.py): one batch of requests scored by an AR
or MDM run, as log-likelihoods with is-greedy flags and Monte-Carlo standard errors.

A batch is a list of groups of request indices. The requests of a group share one forward pass:
for the AR, requests whose model input (the row less its last token) is the same, as lm-eval's
``hf`` backend groups a multiple-choice item's one-token answers; for the MDM, whose noise is a
function of the whole request, only identical requests. Each function returns, per group, one
(log-likelihood, is_greedy, stderr) per member.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from eval.likelihood import left_to_right_log_likelihood
from shared.objective import sum_per_row

Scored = tuple[float, bool, float]  # log-likelihood, is_greedy, Monte-Carlo standard error


def item_seed(seed: int, tokens: list[int], n_scored: int) -> int:
    """The seed of one request's noise: a hash of the run's seed, the request's tokens and how
    many of them are scored, so equal requests draw equal noise wherever they sit in a batch."""
    digest = hashlib.sha256(f"{seed}:{n_scored}:".encode() + np.asarray(tokens, np.int64).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


def padded(rows: list[list[int]], n_scored: list[int], pad_id: int, device, copies: int = 1):
    """Rows right-padded to the longest, each repeated ``copies`` times, with the masks of
    real tokens and of the scored (last ``n_scored``) positions."""
    width = max(map(len, rows))
    tokens = torch.full((len(rows) * copies, width), pad_id, dtype=torch.long)
    valid = torch.zeros_like(tokens, dtype=torch.bool)
    scored = torch.zeros_like(valid)
    for i, (row, n) in enumerate(zip(rows, n_scored)):
        span = slice(i * copies, (i + 1) * copies)
        tokens[span, : len(row)] = torch.tensor(row)
        valid[span, : len(row)] = True
        scored[span, len(row) - n : len(row)] = True
    return tokens.to(device), valid.to(device), scored.to(device)


def ar_scores(model, rows, n_scored, groups, pad_id: int) -> list[list[Scored]]:
    """One causal pass per group over its shared input, scored for every member: the logits at
    the group's longest scored span, of which each member reads its own last ``n`` positions."""
    heads = [rows[group[0]] for group in groups]
    spans = [max(n_scored[i] for i in group) for group in groups]
    device = next(model.parameters()).device
    tokens, _, scored = padded(heads, spans, pad_id, device)
    # Position i predicts token i+1; right padding sits after every real token, so causal
    # attention keeps it out of them. is_greedy comes from the same logits.
    logits = model(tokens[:, :-1], attention="causal", output_mask=scored[:, 1:])
    log_probs, best = torch.log_softmax(logits.float(), dim=-1), logits.argmax(-1)
    found, start = [], 0
    for group, span in zip(groups, spans):
        block, block_best = log_probs[start : start + span], best[start : start + span]
        start += span
        members = []
        for i in group:
            n = n_scored[i]
            targets = torch.tensor(rows[i][-n:], device=device)
            picked = block[-n:].gather(1, targets[:, None]).double().sum().item()
            members.append((picked, bool((block_best[-n:] == targets).all()), 0.0))
        found.append(members)
    return found


def greedy_mdm(model, mask_id: int, tokens, valid, scored) -> list[bool]:
    """Every scored token is the argmax when the whole continuation is masked."""
    noised = torch.where(scored, torch.full_like(tokens, mask_id), tokens)
    logits = model(noised, attention="bidirectional", output_mask=scored, key_valid=valid)
    misses = (logits[:, :mask_id].argmax(-1) != tokens[scored]).double()
    return (sum_per_row(misses, scored.nonzero()[:, 0], len(tokens)) == 0).tolist()


def nelbo_scores(model, objective, rows, n_scored, draws: int, seed: int, pad_id: int):
    """The NELBO of each row's scored tokens over ``draws`` noise draws, drawn for the row
    alone (its own length, its own generator) and padded after, so the batch cannot move
    them; padding is kept out of attention (``key_valid``), so it cannot move the logits."""
    device = next(model.parameters()).device
    tokens, valid, scored = padded(rows, n_scored, pad_id, device, copies=draws)
    t = torch.empty(len(tokens), dtype=torch.float64)
    # 2.0 is above any masking threshold: padding is never masked (nor scored)
    uniforms = torch.full(tokens.shape, 2.0, dtype=torch.float64)
    for i, (row, n) in enumerate(zip(rows, n_scored)):
        generator = torch.Generator().manual_seed(item_seed(seed, row, n))
        noise = objective.repeated_noise(1, draws, len(row), generator)
        t[i * draws : (i + 1) * draws] = noise["t"]
        uniforms[i * draws : (i + 1) * draws, : len(row)] = noise["uniforms"]
    noised, masked, weight = objective.noise_rows(tokens, {"t": t, "uniforms": uniforms}, scored)
    logits = model(noised, attention="bidirectional", output_mask=masked, key_valid=valid)
    token_nats = F.cross_entropy(
        logits[:, : objective.mask_id].float(), tokens[masked], reduction="none"
    )
    row_of = masked.nonzero()[:, 0]
    weighted = token_nats.double() * weight.to(token_nats.device)[row_of]
    per_draw = sum_per_row(weighted, row_of, len(tokens)).view(len(rows), draws).cpu()
    stderr = per_draw.std(1, unbiased=True) / math.sqrt(draws)
    one = slice(None, None, draws)  # one copy of each row for the greedy check
    greedy = greedy_mdm(model, objective.mask_id, tokens[one], valid[one], scored[one])
    return list(zip((-per_draw.mean(1)).tolist(), greedy, stderr.tolist()))


def chain_rule_scores(model, mask_id: int, rows, n_scored, pad_id: int) -> list[Scored]:
    """The exact left-to-right log-likelihood: every scored position masked, then revealed
    left to right, each scored under the model's prediction at that step."""
    device = next(model.parameters()).device
    tokens, valid, scored = padded(rows, n_scored, pad_id, device)
    greedy = greedy_mdm(model, mask_id, tokens, valid, scored)
    total = left_to_right_log_likelihood(model, tokens, scored, mask_id, key_valid=valid)
    return list(zip(total.tolist(), greedy, [0.0] * len(rows)))
