"""Lesson 01's grader of the naive generation loop, `check_generate_naive`: the learner's
`generate_naive` on the tiny Llama, greedy and seeded, against the reference's tokens,
finish reason, text and on_token calls. Every later engine is tested against this loop's
output, so it must stop, sample and report exactly as the reference does.
"""
from __future__ import annotations

import torch

from ..sampling_params import SamplingParams
from .harness import Grader, expect, greedy_tie, grader, references_standing_in, tiny_model


def _run_generate(g, fn, model, tokenizer, prompt, params, label):
    """Call the learner's generate with an on_token recorder that also stops runaway loops."""
    seen = []

    def on_token(step, token_id):
        seen.append((int(step), int(token_id)))
        expect(len(seen) <= params.max_tokens + 5,
               f"generate_naive kept going past max_tokens={params.max_tokens} ({label})")

    with g.case(f"generating with {label}"), torch.no_grad():
        out = fn(model, tokenizer, prompt, params, on_token=on_token)
    for field in ("token_ids", "finish_reason", "text"):
        expect(hasattr(out, field), f"generate_naive should return a CompletionOutput; "
                                    f"the result has no `{field}`")
    return out, seen


def _compare_completion(model, tokenizer, prompt, ours, reference, label, greedy: bool):
    prompt_ids = tokenizer.encode(prompt)
    mine, ref = [int(t) for t in ours.token_ids], list(reference.token_ids)
    n = min(len(mine), len(ref))
    if mine[:n] != ref[:n] and not (greedy and greedy_tie(model, prompt_ids, mine, ref)):
        i = next(j for j in range(n) if mine[j] != ref[j])
        if len(set(mine)) == 1 and len(mine) > 1:
            hint = ("every token is the same: append each new token to the sequence, so the next step "
                    "sees it")
        elif greedy:
            hint = ("each step must run the whole sequence so far (prompt + generated tokens) through "
                    "the model, with positions 0..len-1, and take the logits of the LAST position")
        else:
            hint = ("make one generator with make_generator(params) before the loop and pass it to "
                    "sample() at every step, with the logits of the last position")
        raise AssertionError(f"generate_naive ({label}) differs from the reference at token {i}: "
                             f"yours {mine}, expected {ref}; {hint}")
    if mine[:n] != ref[:n]:
        return                                 # a float-rounding tie: the rest may differ
    expect(len(mine) == len(ref) and ours.finish_reason == reference.finish_reason,
           f"generate_naive ({label}) returned {len(mine)} tokens with finish_reason="
           f"{ours.finish_reason!r}; expected {len(ref)} tokens, finish_reason={reference.finish_reason!r}. "
           "Stop right after the token that makes len(output) == max_tokens ('length'), or after a "
           "token in stop_token_ids or EOS ('stop', that token kept as the last one)")
    expect(ours.text == reference.text,
           f"generate_naive ({label}): text should be tokenizer.decode(token_ids) = {reference.text!r}, "
           f"got {ours.text!r}")


@grader
def check_generate_naive(fn) -> bool:
    """fn(model, tokenizer, prompt, params, on_token=None) -> CompletionOutput, like
    `naive.generate_naive`, on the tiny random Llama.

    Checks greedy tokens equal the reference's, max_tokens is respected
    (finish_reason "length"), a token in stop_token_ids ends generation ("stop"),
    seeded sampling reproduces the reference's tokens, and on_token(step, token_id)
    is called once per token. The reference sampler (and top-k, top-p) stand in for the
    notebook's own while it runs, so only a mistake in `generate_naive` fails this check.
    """
    with references_standing_in(fn, STANDING_IN):
        return _check_generate_naive(fn)


# the notebook's names the naive loop calls, and the exercise each one is (course/outside_help.py)
STANDING_IN = {"sample": "check_sampler", "apply_top_k": "check_top_k", "apply_top_p": "check_top_p"}


def _check_generate_naive(fn) -> bool:
    from ..baselines.naive_generation import generate_naive

    g = Grader("check_generate_naive", "generate_naive")
    model, tokenizer = tiny_model()
    prompt = "The capital of France is"
    with torch.no_grad():
        ref_greedy = generate_naive(model, tokenizer, prompt, SamplingParams(temperature=0, max_tokens=6))
    stop_at = next(i for i, t in enumerate(ref_greedy.token_ids) if i >= 2 and t not in ref_greedy.token_ids[:i])
    cases = [
        (prompt, SamplingParams(temperature=0, max_tokens=6), "greedy, max_tokens=6"),
        ("Once upon a time", SamplingParams(temperature=0, max_tokens=1), "greedy, max_tokens=1"),
        (prompt, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[ref_greedy.token_ids[stop_at]]),
         f"greedy, stop_token_ids=[{ref_greedy.token_ids[stop_at]}] (the token at step {stop_at})"),
        ("List three colors:", SamplingParams(temperature=1.0, top_k=50, seed=1234, max_tokens=6),
         "temperature=1.0, top_k=50, seed=1234"),
    ]
    for text, params, label in cases:
        with torch.no_grad():
            reference = generate_naive(model, tokenizer, text, params)
        ours, seen = _run_generate(g, fn, model, tokenizer, text, params, label)
        _compare_completion(model, tokenizer, text, ours, reference, label, greedy=params.greedy)
        expected_calls = [(i, int(t)) for i, t in enumerate(ours.token_ids)]
        expect(seen == expected_calls,
               f"generate_naive ({label}) should call on_token(step, token_id) once after each token, "
               f"steps counting from 0: expected {expected_calls}, got {seen}")
    again, _ = _run_generate(g, fn, model, tokenizer, cases[-1][0], cases[-1][1], "the same seed again")
    first, second = [int(t) for t in ours.token_ids], [int(t) for t in again.token_ids]
    expect(first == second,
           f"generate_naive: the same seed gave {first} then {second}; "
           "make the generator from params.seed inside generate_naive (make_generator(params))")
    return g.passed()
