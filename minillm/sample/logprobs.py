"""Log-probabilities of the generated tokens (`SamplingParams(logprobs=k)`, vLLM's name and shape).

For each generated position the output carries a dict {token_id: Logprob} holding the
sampled token and the k most likely ones. They come from the model's distribution
before penalties, logit_bias, temperature, top-k and top-p (log_softmax of the raw logits), as vLLM reports
them by default: a logprob then says how likely the *model* found the token, whatever
sampling settings picked it, so two requests with different temperatures compare.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_LOGPROBS = 20      # as OpenAI's top_logprobs and vLLM's default max_logprobs


@dataclass
class Logprob:
    logprob: float
    rank: int                          # 1 = the most likely token
    decoded_token: str | None = None


def token_logprobs(logits: torch.Tensor, token: int, k: int, tokenizer=None) -> dict[int, Logprob]:
    """logits [V] of one position -> {token_id: Logprob} for `token` and the top k (k may be 0)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = float(logp[token])
    rank = int((logp > logp[token]).sum()) + 1
    out = {}
    if k:
        values, ids = torch.topk(logp, k)
        for r, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
            out[t] = Logprob(v, r)
    out.setdefault(token, Logprob(chosen, rank))
    if tokenizer is not None:
        for t, lp in out.items():
            lp.decoded_token = tokenizer.decode([t], skip_special_tokens=False)
    return out


# -- prompt logprobs (`SamplingParams(prompt_logprobs=k)`) ------------------------------------

PROMPT_LOGPROB_ROWS = 256    # rows of [V] logits alive at once: bounds the memory of scoring a long prompt


@dataclass
class PromptLogprobs:
    """One prefill chunk's scores, as the runner computes them (plain data: a worker sends it).
    Entry i scores prompt token `first_position + i`, predicted from the tokens before it."""
    seq_id: int
    first_position: int
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]]           # the k most likely tokens at each position (k may be 0)
    top_logprobs: list[list[float]]

    def as_dicts(self, tokenizer=None) -> list[dict[int, Logprob]]:
        """{token_id: Logprob} per position, the shape of a generated token's logprobs."""
        out = []
        for i, token in enumerate(self.token_ids):
            entry = {t: Logprob(v, r) for r, (t, v) in enumerate(zip(self.top_ids[i], self.top_logprobs[i]), 1)}
            entry.setdefault(token, Logprob(self.logprobs[i], self.ranks[i]))
            if tokenizer is not None:
                for t, lp in entry.items():
                    lp.decoded_token = tokenizer.decode([t], skip_special_tokens=False)
            out.append(entry)
        return out


def score_prompt_tokens(compute_logits, hidden: torch.Tensor, targets: list[int], k: int) -> tuple:
    """hidden [m, D]: the states that predict `targets` (m tokens). Returns (logprobs, ranks,
    top ids, top logprobs) as lists, computing at most PROMPT_LOGPROB_ROWS rows of logits at once."""
    chosen, ranks, top_ids, top_values = [], [], [], []
    for start in range(0, len(targets), PROMPT_LOGPROB_ROWS):
        rows = slice(start, start + PROMPT_LOGPROB_ROWS)
        logp = torch.log_softmax(compute_logits(hidden[rows]).float(), dim=-1)
        target = torch.tensor(targets[rows], device=logp.device)
        picked = logp.gather(1, target[:, None])
        chosen += picked[:, 0].tolist()
        ranks += ((logp > picked).sum(dim=1) + 1).tolist()
        values, ids = torch.topk(logp, k, dim=1)
        top_ids += ids.tolist()
        top_values += values.tolist()
    return chosen, ranks, top_ids, top_values
