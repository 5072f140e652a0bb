"""SamplingParams: how to pick each token, with vLLM's names (lesson 01, the engine, the server).

Checked strictly on construction and whenever a field is assigned, so a bad value is
refused at the door, before it can reach a step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .sample.logprobs import MAX_LOGPROBS
from .structured.params import StructuredOutputsParams
from .utils.validate import Validated, check_bool, check_int, check_number, fail, is_int, is_number


MIN_TEMPERATURE = 1e-2     # vLLM's floor: 0 < T < 0.01 is raised to 0.01 (below it logits / T overflow)
MAX_SEED = 2**64 - 1       # torch generators take 64-bit seeds
# Stop strings are searched at every token of every sequence (text/stopping.py): bounded so one
# request cannot slow every other one's step. OpenAI takes 4; vLLM has no limit; lm-eval and
# chat templates use a handful.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 128
MAX_STOP_TOKEN_IDS = 64
# logit_bias is added to each sampled row at every step: bounded like the stop lists. OpenAI
# takes 300 entries with biases in [-100, 100] (vLLM clamps to that range; we refuse outside it).
MAX_LOGIT_BIAS = 300
MAX_BIAS = 100.0


@dataclass
class SamplingParams(Validated):
    """How to pick each token (vLLM's names). Checked strictly on construction and again
    whenever a field is assigned, so a bad value is refused before it reaches a step."""
    n: int = 1                        # parallel samples per prompt (copy-on-write, lesson 04)
    max_tokens: int = 16              # generated tokens at most
    temperature: float = 1.0          # 0 means greedy
    top_k: int = 0                    # keep the k most likely tokens; 0 or -1: all
    top_p: float = 1.0                # keep the smallest set with this much probability
    seed: int | None = None           # per-request seed in [0, 2**64): reproducible whatever the batch
    stop: list[str] | str | None = None       # strings that end generation (not shown in text)
    stop_token_ids: list[int] | None = None   # token ids that end generation
    ignore_eos: bool = False          # keep going after EOS (benchmarks)
    logprobs: int | None = None       # report the sampled token's logprob and the top k (minillm/sample/logprobs.py)
    prompt_logprobs: int | None = None  # each prompt token's logprob and the top k (a cached prefix is recomputed)
    # vLLM's extras on the logits (minillm/sample/logits_processors.py says how and in which order)
    presence_penalty: float = 0.0     # [-2, 2]: minus this for every token already generated (OpenAI's)
    frequency_penalty: float = 0.0    # [-2, 2]: minus this times how often each token was generated
    repetition_penalty: float = 1.0   # > 0: a token in the prompt or the output: logit / p if positive, else * p
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit, in [-100, 100]; 300 at most
    min_p: float = 0.0                # [0, 1]: drop tokens less likely than min_p x the most likely one
    min_tokens: int = 0               # [0, max_tokens]: EOS and stop_token_ids masked, stop strings not
                                      # looked for, until this many tokens are generated
    # what the text shows (minillm/text/stopping.py)
    include_stop_str_in_output: bool = False   # keep the stop string (or stop token's text) at the end
    skip_special_tokens: bool = True           # leave special tokens (<|im_end|>, ...) out of the text
    spaces_between_special_tokens: bool = True  # slow tokenizers only; fast ones ignore it, as in vLLM
    # the output must match a JSON schema, regex, choice or grammar (minillm/structured/)
    structured_outputs: StructuredOutputsParams | None = None

    def validate(self) -> None:
        name = "SamplingParams"
        check_int(name, "n", self.n, minimum=1)
        check_int(name, "max_tokens", self.max_tokens, minimum=1)
        check_number(name, "temperature", self.temperature, "a number in [0, 100] (0 = greedy)",
                     lambda t: 0 <= t <= 100)
        if 0 < self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        check_int(name, "top_k", self.top_k, minimum=-1)
        check_number(name, "top_p", self.top_p, "a number in (0, 1]", lambda p: 0 < p <= 1)
        check_int(name, "seed", self.seed, minimum=0, maximum=MAX_SEED, optional=True)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if stops is None:
            stops = []
        if not isinstance(stops, (list, tuple)) or len(stops) > MAX_STOP_STRINGS:
            fail(name, "stop", f"a string or a list of at most {MAX_STOP_STRINGS} strings", self.stop,
                 TypeError if not isinstance(stops, (list, tuple)) else ValueError)
        if not all(isinstance(s, str) and s for s in stops):
            fail(name, "stop", "a non-empty string or a list of non-empty strings", self.stop, TypeError)
        if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
            fail(name, "stop", f"strings of at most {MAX_STOP_STRING_CHARS} characters", self.stop)
        object.__setattr__(self, "stop", list(stops))
        ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if isinstance(ids, (list, tuple)) and len(ids) > MAX_STOP_TOKEN_IDS:
            fail(name, "stop_token_ids", f"a list of at most {MAX_STOP_TOKEN_IDS} token ids", self.stop_token_ids)
        if not isinstance(ids, (list, tuple)) or not all(is_int(t) and t >= 0 for t in ids):
            fail(name, "stop_token_ids", "a list of non-negative integers", self.stop_token_ids, TypeError)
        object.__setattr__(self, "stop_token_ids", list(ids))
        check_bool(name, "ignore_eos", self.ignore_eos)
        check_int(name, "logprobs", self.logprobs, minimum=0, maximum=MAX_LOGPROBS, optional=True)
        check_int(name, "prompt_logprobs", self.prompt_logprobs, minimum=0, maximum=MAX_LOGPROBS, optional=True)
        for penalty in ("presence_penalty", "frequency_penalty"):
            check_number(name, penalty, getattr(self, penalty), "a number in [-2, 2]", lambda x: -2 <= x <= 2)
        check_number(name, "repetition_penalty", self.repetition_penalty, "a number > 0 (1 = off)", lambda x: x > 0)
        check_number(name, "min_p", self.min_p, "a number in [0, 1]", lambda x: 0 <= x <= 1)
        check_int(name, "min_tokens", self.min_tokens, minimum=0, maximum=self.max_tokens)
        object.__setattr__(self, "logit_bias", self._checked_logit_bias())
        for flag in ("include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens"):
            check_bool(name, flag, getattr(self, flag))
        object.__setattr__(self, "structured_outputs", StructuredOutputsParams.coerce(self.structured_outputs))

    def _checked_logit_bias(self) -> dict[int, float] | None:
        """A copy of logit_bias, {token id: bias}: ids are non-negative integers (the vocabulary
        is checked where it is known: the server's door, or the step, for this request only)."""
        bias = self.logit_bias
        if bias is None:
            return None
        allowed = (f"a dict of at most {MAX_LOGIT_BIAS} entries {{token id (an integer >= 0): "
                   f"bias in [-{MAX_BIAS:g}, {MAX_BIAS:g}]}}")
        if not isinstance(bias, dict):
            fail("SamplingParams", "logit_bias", allowed, bias, TypeError)
        if len(bias) > MAX_LOGIT_BIAS:
            fail("SamplingParams", "logit_bias", allowed, f"{len(bias)} entries")
        for token, value in bias.items():
            if not is_int(token) or not is_number(value):
                fail("SamplingParams", "logit_bias", allowed, {token: value}, TypeError)
            if token < 0 or not math.isfinite(value) or abs(value) > MAX_BIAS:
                fail("SamplingParams", "logit_bias", allowed, {token: value})
        return {int(t): float(v) for t, v in bias.items()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
