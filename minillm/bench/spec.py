"""Speculative decoding measured: batch-1 decode with and without the n-gram proposer, on an
input-grounded workload (the answer copies or edits a passage in the prompt) and an open-ended
one, beside transformers' own prompt lookup (`generate(prompt_lookup_num_tokens=k)`) on the
same prompts, in the same run; then batches of 8 and 32 to show where it stops paying.

    python -m minillm bench spec [--model M] [--max-tokens 96] [--draft-model D] [--json FILE] [--quick] [engine flags]

Greedy everywhere, so every configuration must produce the same tokens as its baseline
(checked: a speed-up that changed the answer would not count). Speculation is forced on at
batch 8 and 32 here (max_batch_size raised) to show its cost there; the engine's default
switches it off above 4 running sequences.
"""
from __future__ import annotations

import json
import time

import torch

from ..cli.engine_args import add_engine_arguments, engine_options
from ..engine.engine import LLMEngine
from ..models import load_model
from ..sampling_params import SamplingParams

PASSAGE = ("The river rises in the northern hills and flows south through three valleys. In spring the "
           "snowmelt floods the lower fields, and the farmers move their sheep to the high pastures. By "
           "midsummer the water is low and clear, and children swim near the old stone bridge.")
CODE = ("def total_price(items, tax_rate):\n    total = 0\n    for item in items:\n        total += item.price "
        "* item.quantity\n    return total * (1 + tax_rate)\n")
GROUNDED = [f"Copy this passage exactly:\n\n{PASSAGE}", f"Rewrite this function with the variable `total` "
            f"renamed to `subtotal`, changing nothing else:\n\n{CODE}",
            f"Repeat the text below, word for word:\n\n{PASSAGE}"]
PROPOSERS = ("ngram", "self_draft")     # self_draft: the first half of the model's layers
OPEN_ENDED = ["Write a short story about a dragon who learns to bake.", "Explain why the sky is blue.",
              "Give me three ideas for a weekend trip."]


def chat_prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], True) for q in questions]


def decode_rate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, batch: int = 1):
    """(tok/s, the tokens of each request) running `batch` requests at once."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0))         # warm up
    work = (prompts * batch)[:max(batch, len(prompts))]
    outs, generated, start = [], 0, time.perf_counter()
    for i in range(0, len(work), batch):
        results = engine.generate(work[i:i + batch], params)
        outs += [r.outputs[0].token_ids for r in results]
        generated += sum(len(t) for t in outs[-len(results):])
    return generated / (time.perf_counter() - start), outs


def transformers_rate(twin, prompts: list[list[int]], max_tokens: int, lookup: int | None, eos: int):
    kwargs = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.no_grad():                                                              # warm up
        twin.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=eos, **kwargs)
    generated, outs, start = 0, [], time.perf_counter()
    with torch.no_grad():
        for ids in prompts:
            out = twin.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                                eos_token_id=eos, pad_token_id=eos, **kwargs)[0, len(ids):].tolist()
            outs.append(out)
            generated += len(out)
    return generated / (time.perf_counter() - start), outs


def main(args) -> dict:
    from ..models.reference import transformers_twin
    model, tokenizer = load_model(args.model, device="cpu")
    max_tokens = 32 if args.quick else args.max_tokens
    k = args.num_speculative_tokens
    options = {"num_kv_blocks": 1024, **engine_options(args)}
    options.pop("speculative_config", None)             # this bench sets it
    plain = LLMEngine(model, tokenizer, **options)
    methods = PROPOSERS + (("draft_model",) if args.draft_model else ())
    extra = {"draft_model": {"model": args.draft_model}}
    proposers = {method: LLMEngine(model, tokenizer, **options, speculative_config={
        "method": method, "num_speculative_tokens": k, "max_batch_size": 64, **extra.get(method, {})})
        for method in methods}
    twin = transformers_twin(model)
    eos = min(tokenizer.eos_token_ids)
    report = {"tok_s": {}, "speedup": {m: {} for m in methods}, "acceptance": {m: {} for m in methods},
              "transformers": {}, "batched": {}}
    print(f"batch 1, greedy, {max_tokens} tokens, k={k}, {torch.get_num_threads()} threads")
    for workload, questions in (("input_grounded", GROUNDED), ("open_ended", OPEN_ENDED)):
        prompts = chat_prompts(tokenizer, questions[:2] if args.quick else questions)
        base, want = decode_rate(plain, prompts, max_tokens)
        report["tok_s"][workload] = {"minillm": base}
        for method, engine in proposers.items():
            before = dict(engine.speculator.stats())
            fast, got = decode_rate(engine, prompts, max_tokens)
            after = engine.speculator.stats()
            if got != want:
                raise AssertionError(f"{workload}: speculation ({method}) changed the greedy tokens")
            proposed = after["spec_proposed_tokens"] - before["spec_proposed_tokens"]
            accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
            report["tok_s"][workload][f"minillm_{method}"] = fast
            report["speedup"][method][workload] = fast / base
            report["acceptance"][method][workload] = accepted / proposed if proposed else 0.0
            print(f"{workload:<15} minillm {base:6.1f} -> {method:<10} {fast:6.1f} tok/s ({fast / base:.2f}x, "
                  f"acceptance {report['acceptance'][method][workload]:.0%})")
        hf_base, _ = transformers_rate(twin, prompts, max_tokens, None, eos)
        hf_fast, _ = transformers_rate(twin, prompts, max_tokens, k, eos)
        report["transformers"][workload] = {"tok_s": hf_base, "prompt_lookup_tok_s": hf_fast,
                                            "speedup": hf_fast / hf_base}
        print(f"{workload:<15} transformers {hf_base:6.1f} -> prompt lookup {hf_fast:6.1f} tok/s "
              f"({hf_fast / hf_base:.2f}x)")
    ngram = proposers["ngram"]
    prompts = chat_prompts(tokenizer, GROUNDED)
    for batch in ([8] if args.quick else [8, 32]):
        base, _ = decode_rate(plain, prompts, max_tokens, batch)
        fast, _ = decode_rate(ngram, prompts, max_tokens, batch)
        report["batched"][str(batch)] = {"minillm": base, "minillm_ngram": fast, "speedup": fast / base}
        print(f"input_grounded, batch {batch:>2}: {base:6.1f} -> ngram {fast:6.1f} tok/s ({fast / base:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--draft-model", default=None,
                   help="also measure the draft_model proposer with this smaller checkpoint (same tokenizer)")
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    add_engine_arguments(p)
