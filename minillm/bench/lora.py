"""Many fine-tunes on one server: batched LoRA vs the base model vs one merged model per adapter.

    python -m minillm bench lora [--model M] [--num-prompts 64] [--adapters 1 4 16] [--delta grouped packed]
                                 [--seed 0] [--json FILE] [--quick] [engine flags]

The throughput workload (throughput.py: seeded prompt and output lengths, EOS ignored), its
requests spread in turn over N adapters for each N in --adapters. The adapters are made here
with peft on the model (lora/synthetic.py: seeded, ranks 8 and 16, four target-module sets),
and three ways serve the same requests:

  - base: the model alone, no adapter: the yardstick (ratio 1.00);
  - LoRA batched: one engine, enable_lora with max_loras=N: requests for every adapter share
    each step, the base GEMM runs once and each row adds its own adapter's delta, by each
    way of adding it in --delta (lora/manager.py: grouped = the lesson's, packed = packed_delta.py);
  - merged, one after another: each adapter merged into its own copy of the weights
    (lora/merge.py), its share of the requests run as one batch, then the next adapter's:
    no delta at all, but smaller batches, and N copies of the model if they are to stay loaded.

Printed: output tok/s and the ratio to base per row; for each LoRA row, how many requests'
greedy tokens equal the merged models' (a difference would be a float rounding tie between
W x + s B (A x) and (W + s B A) x, or a bug); memory per adapter (its A and B, a slot, a
merged copy). Time counts the generate calls only (building engines and merging are printed apart).
The issue's goal: 16 adapters at >= 0.8x the base model's throughput.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import time

import torch

from ..cli.engine_args import add_engine_arguments, engine_config_from_args, engine_options
from ..engine.engine import LLMEngine
from ..lora.adapter import load_adapter
from ..lora.manager import DEFAULT_DELTA, DELTAS
from ..lora.merge import merged_copy, weight_bytes
from ..lora.request import LoRARequest
from ..lora.synthetic import make_adapters
from ..models import load_model
from ..sampling_params import SamplingParams
from .throughput import background_load, make_workload

GOAL = 0.8          # 16 adapters at >= 0.8x the base model's tok/s (issue 36)


def machine() -> dict:
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__}


def generate(engine, workload, loras) -> tuple[float, list[list[int]]]:
    """Seconds for one generate call over the workload (request i under loras[i]) and its tokens."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in workload]
    start = time.perf_counter()
    outs = engine.generate([p for p, _ in workload], params, lora_request=loras)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    assert [len(t) for t in tokens] == [n for _, n in workload], "a request produced the wrong number of tokens"
    return seconds, tokens


def row(name, n, seconds, workload, tokens, base_tok_s=None, **extra) -> dict:
    out_tokens = sum(n for _, n in workload)
    r = {"name": name, "adapters": n, "seconds": seconds, "output_tokens": out_tokens,
         "tok_per_s": out_tokens / seconds, "tokens": tokens, **extra}
    r["ratio_to_base"] = 1.0 if base_tok_s is None else r["tok_per_s"] / base_tok_s
    return r


def run_lora(model, tokenizer, config, workload, adapters, n: int, delta: str, base_tok_s: float) -> dict:
    built = time.perf_counter()
    rank = max(a["rank"] for a in adapters[:n])
    engine = LLMEngine(model, tokenizer, dataclasses.replace(config, enable_lora=True, max_loras=n, max_lora_rank=rank))
    engine.lora.use_delta(delta)
    loras = [LoRARequest(a["name"], i + 1, a["path"]) for i, a in enumerate(adapters[:n])]
    requests = [loras[i % n] for i in range(len(workload))]
    for lora in loras:
        engine.lora.register(lora)
    built = time.perf_counter() - built
    seconds, tokens = generate(engine, workload, requests)
    slot = slot_bytes(engine.lora)
    engine.shutdown()
    return row(f"LoRA batched, {delta}", n, seconds, workload, tokens, base_tok_s, build_seconds=built,
               slot_bytes=slot)


def run_merged(model, tokenizer, config, workload, adapters, n: int, base_tok_s: float) -> dict:
    """Each adapter merged into a copy of the model, its requests (i % n == k) run, then the next."""
    tokens, seconds, built = [None] * len(workload), 0.0, 0.0
    for k, a in enumerate(adapters[:n]):
        start = time.perf_counter()
        adapter = load_adapter(a["path"], model.config.num_hidden_layers, shapes(model.config), a["rank"])
        merged = merged_copy(model, adapter)
        engine = LLMEngine(merged, tokenizer, config)
        built += time.perf_counter() - start
        mine = [i for i in range(len(workload)) if i % n == k]
        s, toks = generate(engine, [workload[i] for i in mine], None)
        seconds += s
        for i, t in zip(mine, toks):
            tokens[i] = t
        engine.shutdown()
        del engine, merged
    return row("merged, one after another", n, seconds, workload, tokens, base_tok_s, build_seconds=built)


def ops_per_decode_step(model, tokenizer, config, adapters, n: int, delta: str | None, batch: int) -> int:
    """Operations the dispatcher sees in one decode step of `batch` requests spread over n adapters
    (delta None: the base engine, no adapter): a count, the same on every machine."""
    from .op_count import CountOps
    lora = dict(enable_lora=True, max_loras=n, max_lora_rank=max(a["rank"] for a in adapters[:n])) if delta else {}
    engine = LLMEngine(model, tokenizer, dataclasses.replace(config, max_num_seqs=max(batch, config.max_num_seqs), **lora))
    if delta:
        engine.lora.use_delta(delta)
    for i in range(batch):
        a = adapters[i % n]
        engine.add_request(f"ops-{i}", [1000 + i, 1001, 1002, 1003], SamplingParams(temperature=0, max_tokens=4,
                           ignore_eos=True), lora_request=LoRARequest(a["name"], i % n + 1, a["path"]) if delta else None)
    engine.step()                                        # every prompt prefilled: the next steps decode
    engine.step()
    with CountOps() as counter:
        engine.step()
    engine.shutdown()
    return sum(counter.counts.values())


def shapes(c) -> dict:
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    h, i = c.hidden_size, c.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def slot_bytes(manager) -> int:
    """Device bytes one slot takes in every LoRALinear (A and B at max_lora_rank, all sub-projections)."""
    linears = {id(m): m for layer in manager.layers for m in layer.values()}.values()
    return sum(m.A_t[0].nbytes + sum(b[0].nbytes for b in m.B_t) for m in linears)


def memory(model, adapters) -> dict:
    sizes = [load_adapter(a["path"], model.config.num_hidden_layers, shapes(model.config), a["rank"]).num_bytes
             for a in adapters]
    return {"adapter_bytes": sizes, "merged_copy_bytes": weight_bytes(model)}


def run_bench(model, tokenizer, config, workload, counts, deltas, seed=0, std=0.05, root=None) -> dict:
    """Every row (module doc) on `workload`; the adapters are made under `root` (a temp dir if None),
    A and B ~ N(0, std^2): at 0.05 an adapted linear's delta is about half its base output on
    SmolLM2 (the answers change; much larger and 30 layers amplify float rounding into other tokens)."""
    with tempfile.TemporaryDirectory(prefix="minillm-lora-") as tmp:
        adapters = make_adapters(model, root or tmp, max(counts), seed=seed, std=std)
        base_engine = LLMEngine(model, tokenizer, config)
        generate(base_engine, [(p[:8], 2) for p, _ in workload[:2]], None)   # warm-up: first calls load the kernels
        seconds, tokens = generate(base_engine, workload, None)
        base_engine.shutdown()
        rows = [row("base model", 0, seconds, workload, tokens)]
        print_row(rows[0])
        for n in counts:
            merged = run_merged(model, tokenizer, config, workload, adapters, n, rows[0]["tok_per_s"])
            for delta in deltas:
                r = run_lora(model, tokenizer, config, workload, adapters, n, delta, rows[0]["tok_per_s"])
                r["same_tokens_as_merged"] = sum(a == b for a, b in zip(r["tokens"], merged["tokens"]))
                rows.append(r)
                print_row(r)
            rows.append(merged)
            print_row(merged)
        n, batch = max(counts), 2 * max(counts)
        ops = {"base": ops_per_decode_step(model, tokenizer, config, adapters, n, None, batch)}
        ops.update({d: ops_per_decode_step(model, tokenizer, config, adapters, n, d, batch) for d in deltas})
        print(f"operations per decode step (batch {batch}, {n} adapters; the dispatcher's count): "
              + ", ".join(f"{k} {v}" for k, v in ops.items()), flush=True)
        return {"rows": rows, "adapters": adapters, "memory": memory(model, adapters),
                "ops_per_decode_step": {"batch": batch, "adapters": n, **ops}}


def print_row(r) -> None:
    same = f"{r['same_tokens_as_merged']}/{len(r['tokens'])}" if "same_tokens_as_merged" in r else "-"
    print(f"{r['name']:<28}{r['adapters'] or '-':>9}{r['seconds']:>9.1f}{r['output_tokens']:>11}{r['tok_per_s']:>9.1f}"
          f"{r['ratio_to_base']:>9.2f}x{r.get('build_seconds', 0):>9.1f}{same:>13}", flush=True)


def print_memory(report, n_max: int) -> None:
    mem, adapters = report["memory"], report["adapters"]
    by_rank = {}
    for a, b in zip(adapters, mem["adapter_bytes"]):
        by_rank.setdefault(a["rank"], []).append(b)
    slot = max((r["slot_bytes"] for r in report["rows"] if "slot_bytes" in r), default=0)
    mb = 1e6
    print("memory per adapter (float32): A and B " + ", ".join(
          f"rank {r}: {min(v) / mb:.2f}-{max(v) / mb:.2f} MB" for r, v in sorted(by_rank.items()))
          + f"; a slot (max_lora_rank, every module): {slot / mb:.2f} MB; a merged copy of the model: "
          f"{mem['merged_copy_bytes'] / mb:.1f} MB")
    total = sum(mem["adapter_bytes"][:n_max])
    print(f"{n_max} adapters: their A and B {total / mb:.1f} MB beside one base "
          f"({mem['merged_copy_bytes'] / mb:.1f} MB), {n_max} slots {n_max * slot / mb:.1f} MB; "
          f"merged: {n_max} copies {n_max * mem['merged_copy_bytes'] / mb:.1f} MB "
          f"({n_max * mem['merged_copy_bytes'] / max(total, 1):.0f}x the adapters)")


def main(args) -> dict:
    torch.manual_seed(0)
    config = engine_config_from_args(args)               # a bad flag fails here, before loading
    counts = sorted(set(args.adapters))
    if min(counts) < 1:
        raise ValueError(f"--adapters: each count must be >= 1, got {args.adapters}")
    model, tokenizer = load_model(args.model, device=config.device, dtype=config.dtype)
    if args.quick:
        workload = make_workload(args.num_prompts or 16, args.seed, model.config.vocab_size, (16, 64), (8, 24))
    else:
        workload = make_workload(args.num_prompts or 64, args.seed, model.config.vocab_size)
    m = machine()
    print(f"machine: {m['cpu']} ({m['cores']} cores, torch threads {m['torch_threads']}"
          f"{', GPU ' + m['gpu'] if m['gpu'] else ''}), device {model.device}, torch {m['torch']}, "
          f"load/core at start {background_load():.2f}", flush=True)
    print(f"workload: {len(workload)} prompts, seed {args.seed}, prompt tokens {sum(len(p) for p, _ in workload)}, "
          f"output tokens {sum(n for _, n in workload)}; adapters {counts}, ranks 8 and 16, requests spread in turn",
          flush=True)
    print(f"engine options (the rest EngineConfig's defaults): {engine_options(args)}", flush=True)
    print(f"{'engine':<28}{'adapters':>9}{'seconds':>9}{'output tok':>11}{'tok/s':>9}{'x base':>10}"
          f"{'build s':>9}{'= merged':>13}")
    report = run_bench(model, tokenizer, config, workload, counts, args.delta, args.seed)
    print_memory(report, max(counts))
    best = {r["adapters"]: r["ratio_to_base"] for r in report["rows"] if r["name"].startswith("LoRA")
            and r["name"].endswith(args.delta[-1])}
    if max(counts) in best:
        ratio = best[max(counts)]
        print(f"goal: {max(counts)} adapters >= {GOAL}x the base model ({args.delta[-1]} delta): {ratio:.2f}x, "
              f"{'met' if ratio >= GOAL else 'NOT met'}   (load/core at end {background_load():.2f})")
    report.update(machine=m, workload={"num_prompts": len(workload), "seed": args.seed, "quick": args.quick},
                  engine_options=engine_options(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report, "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in report["rows"]]},
                      f, indent=2)
    return report


def add_arguments(p) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16], help="adapter counts to spread over")
    p.add_argument("--delta", nargs="+", choices=DELTAS, default=sorted(DELTAS, key=lambda d: d == DEFAULT_DELTA),
                   help="ways of adding the LoRA delta to measure (the last one is held to the goal)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="a small workload for a smoke run")
    add_engine_arguments(p, dtype="float32")
