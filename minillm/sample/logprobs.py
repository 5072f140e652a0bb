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
