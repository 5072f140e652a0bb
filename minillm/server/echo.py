"""`echo` on /v1/completions: the prompt comes back in front of the completion, and with
`logprobs` the prompt's tokens are scored too (OpenAI's legacy shape: the first token has no
logprob, so `token_logprobs[0]` and `top_logprobs[0]` are null).

This is how lm-eval's `local-completions` model scores a continuation: it sends context +
continuation as token ids with `echo: true, logprobs: 1, max_tokens: 0 or 1` and sums
`token_logprobs[ctxlen:-1]`. The scores are the engine's prompt logprobs
(`SamplingParams.prompt_logprobs`), so the server computes what the model's own log-softmax
over the prompt says, with no sampling settings applied.
"""
from __future__ import annotations

from .limits import off_the_loop
from .logprobs import completion_logprobs
from .protocol import CompletionRequest
from .responses import CompletionLogprobs


class Echo:
    def __init__(self, texts: list[str], k: int | None, tokenizer):
        self.texts, self.k, self.tokenizer = texts, k, tokenizer

    @classmethod
    async def of(cls, req: CompletionRequest, prompts: list[list[int]], tokenizer) -> "Echo":
        """Text prompts echo as sent; token-id prompts echo as their decoded text."""
        p = req.prompt
        if isinstance(p, str) or isinstance(p[0], str):
            texts = [p] if isinstance(p, str) else list(p)
        else:
            texts = await off_the_loop(lambda: [tokenizer.decode(ids) for ids in prompts])
        return cls(texts, req.logprobs, tokenizer)

    def prepend(self, i: int, out, text: str, logprobs: CompletionLogprobs | None):
        """Prompt i's text (and scored tokens) in front of a choice's text (and logprobs)."""
        if self.k is None:
            return self.texts[i] + text, logprobs
        ids, scored = out.prompt_token_ids, out.prompt_logprobs
        first = self.tokenizer.decode(ids[:1], skip_special_tokens=False)
        head = CompletionLogprobs(tokens=[first], token_logprobs=[None], top_logprobs=[None], text_offset=[0])
        head = joined(head, completion_logprobs(scored[1:], ids[1:], self.k))
        return self.texts[i] + text, joined(head, logprobs or CompletionLogprobs())


def joined(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    """b after a: b's text offsets move past a's text."""
    end = a.text_offset[-1] + len(a.tokens[-1]) if a.tokens else 0
    return CompletionLogprobs(tokens=a.tokens + b.tokens, token_logprobs=a.token_logprobs + b.token_logprobs,
                              top_logprobs=a.top_logprobs + b.top_logprobs,
                              text_offset=a.text_offset + [end + o for o in b.text_offset])
