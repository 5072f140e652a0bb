"""Pipeline parallelism measured: per number of stages P, with and without micro-batches in
flight, a decode step's time split into each stage's busy time and its transfers, the
pipeline's idle fraction beside the formula, tokens/s against one rank; and what the plan's
codec costs against pickle.

    python -m minillm bench pp [--model M | --model-shape S] [--stages 1 2] [--batch 8] [--max-tokens 32] [--quick]

Each rank counts its seconds inside a step and the seconds it was blocked in that step: waiting
to receive a micro-batch (the stages before it still computing), for a send to be taken, for the
driver to take its logits (stage_worker.py); busy = step - blocked. The idle fraction is the
share of P x (the driver's step time) no stage was busy. With m micro-batches in flight a
pipeline of equal stages idles (P - 1) / (m + P - 1) of the time: each P > 1 runs with m = 1 (the
stages take turns: (P - 1) / P) and with the executor's default m = P. The measured fraction is
above the formula by the driver's own share of a step (scheduling, sampling: every stage waits)
and by unequal stages. On CPU the ranks are processes on one host sharing its cores (the
numbers are one machine's, say so when quoting them); across machines each stage has its own.
"""
from __future__ import annotations

import json
import pickle
import time

import torch

from ..distributed import wire
from ..engine.engine import LLMEngine
from ..sampling_params import SamplingParams
from .model_args import add_model_arguments, label, load, print_header, resolve_model_args

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def measure(model, tokenizer, stages: int, batch: int, max_tokens: int, micro: int = 1) -> dict:
    engine = LLMEngine(model, tokenizer, pipeline_parallel_size=stages, num_kv_blocks=max(64, batch * 8),
                       enable_prefix_caching=False)
    try:
        if stages > 1:
            engine.runner.micro_batches = micro
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"r{i}", tokenizer.apply_chat_template(
                [{"role": "user", "content": f"{PROMPT} ({i})"}], True), params)
        while any(not r.seqs[0].output_token_ids for r in engine.requests.values()):       # prefill done
            engine.step()
        before = engine.runner.counters() if stages > 1 else None
        steps, start = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        seconds = (time.perf_counter() - start) / steps
        row = {"stages": stages, "batch": batch, "step_ms": 1000 * seconds, "tok_per_s": batch / seconds}
        if stages > 1:
            row.update(split(before, engine.runner.counters(), seconds, stages))
        return row
    finally:
        close = getattr(engine.runner, "close", None)
        if close is not None:
            close()


def split(before: list[dict], after: list[dict], seconds: float, stages: int) -> dict:
    """Per stage (its TP rank 0): busy ms per step and ms in sends; m, the micro-batches per step;
    the idle fraction measured and the formula's (module doc)."""
    out, busy_total, m = {}, 0.0, 1.0
    for b, a in zip(before, after):
        if a["rank"] != 1 + a["stage"] * (len(after) // stages):
            continue
        steps = max(1, a["steps"] - b["steps"])
        sent = sum(a["transfer_seconds"][k] - b["transfer_seconds"].get(k, 0.0)
                   for k in a["transfer_seconds"] if k.startswith(f"pair{a['stage']}."))
        busy = (a["busy_seconds"] - b["busy_seconds"]) / steps
        busy_total += busy
        m = (a["micro_batches"] - b["micro_batches"]) / steps
        out[f"stage{a['stage']}_busy_ms"] = 1000 * busy
        out[f"stage{a['stage']}_send_ms"] = 1000 * sent / steps
    out["micro_batches"] = m
    out["idle_fraction"] = max(0.0, 1 - busy_total / (stages * seconds))
    out["idle_formula"] = (stages - 1) / (m + stages - 1)
    return out


def codec(batch: int, rounds: int) -> dict:
    """Microseconds to encode + decode a `batch`-sequence decode plan: wire.py's JSON vs pickle."""
    seqs = [{"id": i, "start": 300 + i, "tokens": [17], "table": list(range(i * 20, i * 20 + 20)), "sample": True}
            for i in range(batch)]
    data = wire.encode("step", seqs=seqs, micro=[batch])
    start = time.perf_counter()
    for _ in range(rounds):
        wire.decode(wire.encode("step", _checked=False, seqs=seqs, micro=[batch]))     # as the executor sends it
    ours = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for _ in range(rounds):
        pickle.loads(pickle.dumps(("step", seqs)))
    theirs = (time.perf_counter() - start) / rounds
    return {"plan_bytes": len(data), "wire_us": 1e6 * ours, "pickle_us": 1e6 * theirs}


def run(args) -> dict:
    torch.set_grad_enabled(False)
    resolve_model_args(args)
    print_header(args)
    model, tokenizer = load(args, device="cpu")
    max_tokens = 8 if args.quick else args.max_tokens
    rows = [measure(model, tokenizer, p, args.batch, max_tokens, m) for p in args.stages
            for m in ((1, p) if p > 1 else (1,))]
    base = rows[0]["tok_per_s"]
    for row in rows:
        row["tok_per_s_vs_first"] = row["tok_per_s"] / base
        print("  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    plan = codec(args.batch, 200 if args.quick else 2000)
    print(f"plan of a {args.batch}-sequence decode step ({plan['plan_bytes']} bytes): wire.py encode+decode "
          f"{plan['wire_us']:.0f} us, pickle {plan['pickle_us']:.0f} us (CPU processes on one host)")
    report = {"stages": rows, "codec": plan, "model": label(args), "machine": f"CPU, {torch.get_num_threads()} threads"}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def main(args) -> dict:
    return run(args)


def add_arguments(p) -> None:
    add_model_arguments(p, help="default: the embedded SmolLM2")
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2],
                   help="pipeline sizes, each P > 1 with 1 and with P micro-batches; the first is the baseline")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
