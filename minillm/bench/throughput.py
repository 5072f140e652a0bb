"""Offline throughput: minillm's engine vs transformers' padded static batching.

One fixed, seeded workload of mixed prompt and output lengths (EOS ignored, so
every request produces exactly its output length), run by both on the same model
and device in one process. transformers pads each batch to its longest prompt and
runs it until its longest output is done; only the requested tokens count as
useful output. The ratio is minillm's output tokens/s over the best batch size.

minillm runs with chunked prefill in steps of at most 2048 tokens (vLLM's chunked-prefill
setting): smaller steps keep each layer's intermediates in cache. Measured here, prefill of
the whole workload took 31-33 s in 8192-token steps and 29-30 s in 2048-token steps.

    python -m minillm bench throughput [--model M | --model-shape S | --hf-config F] [--num-prompts 64] [--seed 0] [--json FILE] [--quick]
                                       [--against llama.cpp]
                                       [engine flags: --quantization int8, --max-num-seqs 32, ...]

The model loads in float32 unless --dtype says otherwise; the ceiling is a matmul in that dtype
(on a CPU with AMX, bfloat16's is several times float32's: `python -m minillm.bench.dtype_cost`
says what bfloat16 costs in tokens).
minillm's row is labelled by its weights' scheme (`minillm float32`, `minillm w4a8`, ...).

`--against llama.cpp` also runs the same workload (same prompt tokens and output lengths,
greedy, EOS ignored) through llama.cpp's batched decoding (`llama_cpp_batched.py`, as many
sequences at once as --max-num-seqs) on the embedded model's Q4_1 GGUF (with dummy weights: the
same weights as a GGUF, models/gguf_export.py), and prints minillm / llama.cpp. llama-cpp-python is optional (`pip install llama-cpp-python`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import time

import torch

from ..cli.engine_args import add_engine_arguments, engine_config_from_args, engine_options
from ..engine.engine import LLMEngine
from .against_llama_cpp import LLAMA_CPP_ROW, batched_label, find_llama_cpp
from .ceiling import matmul_flops_per_second, workload_flops
from ..models.reference import transformers_twin
from .model_args import add_model_arguments, is_dummy_run, label, load, print_header, resolve_model_args
from ..sampling_params import SamplingParams


def make_workload(num_prompts: int, seed: int, vocab_size: int, prompt_range=(32, 512),
                  output_range=(32, 256)) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) pairs; token ids avoid the special tokens at the start."""
    rng = random.Random(seed)
    return [([rng.randrange(1000, vocab_size) for _ in range(rng.randint(*prompt_range))],
             rng.randint(*output_range)) for _ in range(num_prompts)]


def scheme(config, model) -> str:
    """What minillm's weights are in: the quantization scheme, or the model's float dtype."""
    return config.quantization or str(next(model.parameters()).dtype).removeprefix("torch.")


def run_minillm(model, tokenizer, workload, config=None, **options) -> dict:
    engine = LLMEngine(model, tokenizer, config, **options)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in workload]
    start = time.perf_counter()
    outs = engine.generate([p for p, _ in workload], params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == sum(n for _, n in workload), "minillm produced the wrong number of tokens"
    name = f"minillm {scheme(engine.config, model)}"
    return {"name": name, "seconds": elapsed, "output_tokens": tokens, "tok_per_s": tokens / elapsed,
            "stats": engine.stats()}


@torch.inference_mode()
def run_transformers_static(hf_model, workload, batch_size: int, device) -> dict:
    """Padded static batching with transformers' generate, batch by batch in workload order."""
    hf_model.generation_config.pad_token_id = 0
    useful, start = 0, time.perf_counter()
    for i in range(0, len(workload), batch_size):
        batch = workload[i:i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (p, _) in enumerate(batch):          # left padding: every row ends at the same column
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        new = max(n for _, n in batch)
        hf_model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                          min_new_tokens=new, do_sample=False, eos_token_id=None,
                          temperature=None, top_p=None, top_k=None)
        useful += sum(n for _, n in batch)
    elapsed = time.perf_counter() - start
    return {"name": f"transformers static batch {batch_size}", "seconds": elapsed,
            "output_tokens": useful, "tok_per_s": useful / elapsed}


def background_load() -> float:
    """1-minute load average per core: above ~0.2 means another process shares the CPU."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return float("nan")


def run_llama_cpp(llama_cpp, path, workload, max_seqs: int) -> dict:
    from .llama_cpp_batched import run_workload
    r = run_workload(llama_cpp, path, workload, max_seqs)
    return {"name": f"llama.cpp batched ({r['max_seqs']} seqs)", "seconds": r["seconds"],
            "output_tokens": r["output_tokens"], "tok_per_s": r["tok_per_s"], "max_seqs": r["max_seqs"]}


def main(args) -> dict:
    torch.manual_seed(0)
    resolve_model_args(args)
    config = engine_config_from_args(args)               # a bad flag fails here, before loading
    print_header(args)
    notes = []
    llama_cpp, path = (find_llama_cpp(args.model, notes, args.load_format) if args.against == LLAMA_CPP_ROW
                       else (None, None))
    model, tokenizer = load(args, device=config.device, dtype=config.dtype)
    device = model.device
    if args.quick:
        workload = make_workload(args.num_prompts or 8, args.seed, model.config.vocab_size, (16, 64), (8, 32))
        batch_sizes = [4, 8]
    else:
        workload = make_workload(args.num_prompts or 64, args.seed, model.config.vocab_size)
        batch_sizes = [8, 32]
    if getattr(args, "skip_transformers", False):
        batch_sizes = []
    hf = transformers_twin(model).to(device) if batch_sizes else None
    dtype = next(model.parameters()).dtype                # bfloat16's matmuls have their own ceiling (AMX)
    ceiling = matmul_flops_per_second(str(device), dtype=dtype)
    useful = workload_flops(model.config, workload)
    print(f"workload: {len(workload)} prompts, seed {args.seed}, prompt tokens "
          f"{sum(len(p) for p, _ in workload)}, output tokens {sum(n for _, n in workload)}, device {device}, "
          f"load/core at start {background_load():.2f}", flush=True)
    print(f"compute ceiling ({str(dtype).removeprefix('torch.')} matmul, measured now): {ceiling / 1e9:.0f} GFLOP/s; "
          f"useful work of the workload: {useful / 1e12:.2f} TFLOP", flush=True)
    options = dataclasses.asdict(config)
    print(f"minillm engine options (the rest EngineConfig's defaults): {engine_options(args)}", flush=True)
    print(f"{'engine':<34}{'seconds':>10}{'output tok':>12}{'tok/s':>10}{'ceiling':>11}")
    results = []
    runs = [lambda: run_minillm(model, tokenizer, workload, config)] + \
           [lambda bs=bs: run_transformers_static(hf, workload, bs, device) for bs in batch_sizes]
    if path is not None:
        runs.append(lambda: run_llama_cpp(llama_cpp, path, workload, config.max_num_seqs))
    for run in runs:
        r = run()
        r["fraction_of_ceiling"] = useful / r["seconds"] / ceiling
        results.append(r)
        print(f"{r['name']:<34}{r['seconds']:>10.1f}{r['output_tokens']:>12}{r['tok_per_s']:>10.1f}"
              f"{100 * r['fraction_of_ceiling']:>10.0f}%", flush=True)
    theirs = [r["tok_per_s"] for r in results[1:] if r["name"].startswith("transformers")]
    ratio = results[0]["tok_per_s"] / max(theirs) if theirs else None
    print((f"ratio minillm / best transformers: {ratio:.2f}x" if theirs else "transformers skipped")
          + f"   (load/core at end {background_load():.2f})" + (f"   [{label(args)}]" if is_dummy_run(args) else ""))
    report = {"workload": {"num_prompts": len(workload), "seed": args.seed, "quick": args.quick,
                           "device": str(device)}, "model": label(args), "dummy_weights": is_dummy_run(args), "engine_options": options, "scheme": scheme(config, model),
              "ceiling_flops_per_s": ceiling, "useful_flops": useful,
              "results": results, "ratio": ratio, "notes": notes}
    if path is not None:
        report["ratio_llama_cpp"] = results[0]["tok_per_s"] / results[-1]["tok_per_s"]
        report["llama_cpp_throughput"] = batched_label(results[-1]["max_seqs"])
        print(f"ratio minillm / llama.cpp batched: {report['ratio_llama_cpp']:.2f}x   "
              f"(llama.cpp: {report['llama_cpp_throughput']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="a small workload for a smoke run")
    p.add_argument("--skip-transformers", action="store_true",
                   help="no transformers rows (slow at 1B: its static batches take many minutes)")
    p.add_argument("--against", choices=[LLAMA_CPP_ROW], default=None,
                   help="also run the workload batched through llama.cpp (llama-cpp-python), if installed")
    add_engine_arguments(p, dtype="float32")
