"""The engine's logprobs ({token_id: Logprob} per generated token) in OpenAI's two shapes.

/v1/completions (legacy): parallel lists per token: `tokens`, `token_logprobs`, `top_logprobs`
(a {token: logprob} dict of the top k, plus the sampled token as vLLM adds it) and
`text_offset` (where each token's text starts in the completion).
/v1/chat/completions: `content`, a list of {token, logprob, bytes, top_logprobs: [...]}.
Both report the model's distribution before penalties, temperature and top-p (see minillm/sample/logprobs.py).
"""
from __future__ import annotations

from .responses import ChatLogprobs, CompletionLogprobs, PromptLogprob, TokenLogprob, TopLogprob


def _token(lp) -> str:
    return lp.decoded_token or ""


def completion_logprobs(steps: list[dict], token_ids: list[int], k: int, offset: int = 0) -> CompletionLogprobs:
    """`steps[i]` holds token_ids[i]'s logprob and the top k; `offset`: text already sent."""
    out = CompletionLogprobs()
    for step, token in zip(steps, token_ids):
        chosen = step[token]
        out.tokens.append(_token(chosen))
        out.token_logprobs.append(chosen.logprob)
        out.top_logprobs.append({_token(lp): lp.logprob for t, lp in step.items() if lp.rank <= k or t == token})
        out.text_offset.append(offset)
        offset += len(_token(chosen))
    return out


def chat_logprobs(steps: list[dict], token_ids: list[int], k: int) -> ChatLogprobs:
    def entry(lp) -> dict:
        text = _token(lp)
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for step, token in zip(steps, token_ids):
        top = sorted((lp for lp in step.values() if lp.rank <= k), key=lambda lp: lp.rank)
        content.append(TokenLogprob(**entry(step[token]), top_logprobs=[TopLogprob(**entry(lp)) for lp in top]))
    return ChatLogprobs(content=content)


def prompt_logprobs_json(prompt_logprobs: list | None) -> list | None:
    """The engine's prompt_logprobs in vLLM's JSON shape: None, then {"token id": {logprob, rank,
    decoded_token}} per prompt token."""
    if prompt_logprobs is None:
        return None
    return [None if entry is None else
            {str(t): PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=lp.decoded_token)
             for t, lp in entry.items()} for entry in prompt_logprobs]
