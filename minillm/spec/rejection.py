"""Verify drafted tokens against the model's own distribution (Leviathan et al., Chen et al.).

logits[i] is the model's prediction after the sequence plus drafts[:i]. Greedy: a draft is
accepted exactly when it is the argmax, so the output is the same token for token as without
speculation. Sampling: draft i (proposed with probability q) is accepted with probability
min(1, p/q); on rejection the token is drawn from normalise(max(0, p - q)), which makes every
emitted token distributed exactly as p. An n-gram proposal is a point mass (q = 1 on the
draft), so it is accepted with probability p(draft) and a rejection draws from p with the
draft removed. When every draft is accepted the last row gives one more token (the bonus).
p is the distribution sampling would use: temperature, top-k and top-p applied.
"""
from __future__ import annotations

import torch

from ..sample.sampler import apply_top_k, apply_top_p


def target_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """[k + 1, V] -> the probabilities sample() would draw from, row by row."""
    rows = logits.float() / params.temperature
    return apply_top_p(apply_top_k(rows, params.top_k), params.top_p).softmax(dim=-1)


def verify(logits: torch.Tensor, drafts: list[int], params, generator=None) -> list[int]:
    """logits [len(drafts) + 1, V] -> the tokens to emit: the accepted drafts, then one token
    from the model (a correction at the first rejection, or the bonus after a full accept)."""
    if params.greedy:
        best = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and best[accepted] == drafts[accepted]:
            accepted += 1
        return drafts[:accepted] + [best[accepted]]
    probs = target_probs(logits, params)
    device = probs.device
    for i, draft in enumerate(drafts):
        u = torch.rand(1, generator=generator, device=device)
        if u < probs[i, draft]:                  # accept with probability p(draft) / q(draft), q = 1
            continue
        residual = probs[i].clone()
        residual[draft] = 0.0                    # max(0, p - q) for a point mass q on the draft
        return drafts[:i] + [int(torch.multinomial(residual, 1, generator=generator))]
    return drafts + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]
