"""How much a quantized model differs from float32: `python -m minillm.quant.quality`.

Three numbers per scheme, on the embedded SmolLM2-135M-Instruct, always against the same
model in float32 on CPU:
  - KL: the mean KL(float32 || quantized) of the next-token distributions, over every
    position of a fixed text (quality_text.txt, ~2000 tokens, written for this; never
    downloaded). 0 means identical distributions.
  - ppl delta: the quantized model's perplexity on that text minus float32's.
  - greedy agreement: on the chat prompts the tests use, the share of greedy tokens that
    match float32's before the first difference (1.0: every completion identical).

A quantized model is not expected to give float32's tokens; the engine's contract for it is
to give its OWN no-cache greedy tokens (tests/test_quantization.py).

Measured (`python -m minillm.quant.quality --float-head`, 2063 tokens, 5 prompts x 32 tokens):
    scheme       mean KL   ppl delta   greedy agreement     (float32 perplexity 23.321)
    int8          0.0030     +0.111        0.525
    int4-g32      0.0000     +0.000        1.000
    int4-g128     0.4677    +18.007        0.163
Why int4-g32 is exact: the embedded checkpoint is a GGUF in Q4_1 (blocks of 32 weights with a
scale and a minimum): its float weights already sit on int4-g32's grid, so re-quantizing with
group 32 gives them back. That is also why 32 is the default group size: on this model g128
re-rounds them onto a coarser grid (KL 0.47); on a model trained in float, expect g32 to be
the better of the two too (smaller groups, tighter ranges), at 1/8 more bytes for the scales.
With the head in int8 too (the default since; `quantize_model`'s `include_head`), same command
and text: int8 KL 0.0044, ppl delta +0.161, greedy agreement 0.556; int4-g32 KL 0.0012, ppl
delta +0.047, greedy agreement 0.819 (the layers stay exact; what remains is the head's rounding).
int8's greedy agreement counts tokens before the first difference, so one early flip on a
near-tie costs a whole completion; its KL is 150x smaller than g128's.
w4a8-g32 (int4-g32's weights, activations rounded to int8 in blocks of 32; int8 head), same
command: KL 0.0032, ppl delta +0.074, greedy agreement 0.450: the activations' rounding costs
about what int8 weights cost (KL 0.0044), and its early near-tie flips cut the agreement (0.281
with lesson 01's no-cache loop: one row at a time, the rounded activations tip other near-ties).
float16 scales and minimums (int4.py; w4a8 reads 0.625 bytes a weight instead of 0.75): on
this model every int4-g32 scale and minimum already IS a float16 value (the GGUF stores them
so): 0 of the 3,317,760 groups of its decoder layers change, so the weights, and every figure
above for int4-g32 and w4a8-g32, are the same bits as with float32 scales. On a model trained
in float a scale moves by at most 2^-11 of itself (and the codes are chosen on the rounded
grid); not measured here (no such model without a download).
"""
from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention import NoCache
from ..kv.contiguous import ContiguousKVCache
from .swap import quantize_model

TEXT = (Path(__file__).with_name("quality_text.txt")).read_text()
CHAT_PROMPTS = ("What is the capital of France?", "Name three fruits.", "Count to five.",
                "Name a primary color.", "What is the capital of Italy?")
SCHEMES = {"int8": ("int8", {}), "int4-g32": ("int4", {"group_size": 32}),
           "int4-g128": ("int4", {"group_size": 128}), "w4a8-g32": ("w4a8", {"group_size": 32})}
CHUNK = 256              # positions whose logits are held at once (49152 floats each)


@torch.inference_mode()
def next_token_log_probs(model, ids: list[int]):
    """Yield log-softmax [rows, V] of the next-token distribution at every position, CHUNK rows at a time."""
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), NoCache([len(ids)]))
    for start in range(0, len(ids) - 1, CHUNK):
        yield F.log_softmax(model.compute_logits(hidden[start:min(start + CHUNK, len(ids) - 1)]), dim=-1)


def text_metrics(reference, model, ids: list[int]) -> tuple[float, float, float]:
    """(mean KL(reference || model), perplexity of reference, perplexity of model) on ids.
    `reference`: a model, or its `next_token_log_probs` on ids already computed (a list)."""
    targets = torch.tensor(ids[1:])
    kl_sum = nll_ref = nll = 0.0
    start = 0
    ref_chunks = reference if isinstance(reference, list) else next_token_log_probs(reference, ids)
    for ref_lp, lp in zip(ref_chunks, next_token_log_probs(model, ids)):
        t = targets[start:start + len(lp)]
        kl_sum += (ref_lp.exp() * (ref_lp - lp)).sum().item()
        nll_ref -= ref_lp.gather(1, t[:, None]).sum().item()
        nll -= lp.gather(1, t[:, None]).sum().item()
        start += len(lp)
    n = len(ids) - 1
    return kl_sum / n, math.exp(nll_ref / n), math.exp(nll / n)


@torch.inference_mode()
def greedy_tokens(model, tokenizer, prompts, max_tokens: int) -> list[list[int]]:
    """Each chat prompt's first max_tokens greedy tokens (EOS ignored), with lesson 02's contiguous
    KV cache: the prompt once, then one token a step, 3-10x faster than lesson 01's no-cache loop.
    The same tokens as that loop on every scheme (float and int8 head, 12 and 32 tokens), except
    w4a8-g32 at 32 tokens: its rounded activations tip near-ties (tests/test_quantization.py's TIES)."""
    out = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        cache = ContiguousKVCache.for_model(model, 1, len(ids) + max_tokens)
        tokens, feed, start = [], ids, 0
        while len(tokens) < max_tokens:
            cache.set_step([0], [start], len(feed))
            positions = torch.arange(start, start + len(feed), device=model.device)
            hidden = model(torch.tensor(feed, device=model.device), positions, cache)
            tokens.append(int(model.compute_logits(hidden[-1:])[0].argmax()))
            start, feed = start + len(feed), tokens[-1:]
        out.append(tokens)
    return out


def agreement(reference: list[list[int]], tokens: list[list[int]]) -> float:
    """Share of tokens before the first difference, over all completions."""
    matched = 0
    for ref, ours in zip(reference, tokens):
        same = next((i for i, (a, b) in enumerate(zip(ref, ours)) if a != b), len(ref))
        matched += same
    return matched / sum(len(r) for r in reference)


def float_copy(model):
    """A deep copy sharing what cannot be copied: PanelLinear's compiled kernel (a ctypes function)."""
    shared = {id(m.kernel): m.kernel for m in model.modules() if hasattr(m, "kernel")}
    return copy.deepcopy(model, memo=shared)


def measure(model, tokenizer, schemes=SCHEMES, text: str = TEXT, prompts=CHAT_PROMPTS,
            max_tokens: int = 32, include_head: bool | None = None) -> dict:
    """{scheme: {"kl", "ppl", "ppl_float", "ppl_delta", "greedy_agreement"}} for a float32 CPU model
    (left unchanged: each scheme quantizes a copy). `schemes`: name -> (method, options)."""
    ids = tokenizer.encode(text)
    float_tokens = greedy_tokens(model, tokenizer, prompts, max_tokens)
    # float32's distributions, computed once for every scheme (len(ids) x vocab floats: 400 MB for TEXT)
    reference = list(next_token_log_probs(model, ids)) if len(schemes) > 1 else model
    results = {}
    for name, (method, options) in schemes.items():
        quantized = quantize_model(float_copy(model), method, include_head=include_head, **options)
        kl, ppl_float, ppl = text_metrics(reference, quantized, ids)
        tokens = greedy_tokens(quantized, tokenizer, prompts, max_tokens)
        results[name] = {"kl": kl, "ppl": ppl, "ppl_float": ppl_float, "ppl_delta": ppl - ppl_float,
                         "greedy_agreement": agreement(float_tokens, tokens) if prompts else None}
    return results


def main(argv=None) -> None:
    from ..models import load_model
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per chat prompt")
    p.add_argument("--float-head", action="store_true", help="keep the output head in float32")
    p.add_argument("--schemes", nargs="*", default=list(SCHEMES), choices=list(SCHEMES))
    args = p.parse_args(argv)
    model, tokenizer = load_model(args.model, device="cpu", dtype=torch.float32)
    results = measure(model, tokenizer, {name: SCHEMES[name] for name in args.schemes}, max_tokens=args.max_tokens,
                      include_head=not args.float_head)
    ppl_float = next(iter(results.values()))["ppl_float"]
    print(f"{len(tokenizer.encode(TEXT))} tokens of text, {len(CHAT_PROMPTS)} chat prompts x {args.max_tokens} "
          f"greedy tokens; head {'float' if args.float_head else 'int8'}; float32 perplexity {ppl_float:.3f}")
    print(f"{'scheme':<12}{'mean KL':>10}{'ppl delta':>12}{'greedy agreement':>19}")
    for name, r in results.items():
        print(f"{name:<12}{r['kl']:>10.4f}{r['ppl_delta']:>+12.3f}{r['greedy_agreement']:>19.3f}")


if __name__ == "__main__":
    main()
