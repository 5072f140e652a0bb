"""Quantization side by side: float32, int8, int4 and w4a8 (int4 weights, int8 activations)
(eager, and compiled with `--compile`), and llama.cpp on the same model's GGUF, one engine at a
time in one run.

    python -m minillm bench quant [--model M | --model-shape S | --hf-config F] [--quick] [--json FILE]
                                  [--against llama.cpp] [--compile [--compiled-only]]
                                  [engine flags: --quantization int8, --max-num-seqs 1, ...]

The engine flags are cli/engine_args.py's, with two read as the rows to run: `--compile` adds
a compiled row beside each eager one, `--quantization Q` keeps float32 (the reference) and Q
(`none`: float32 alone). The model loads on the CPU in float32 unless --device/--dtype say
otherwise. With --compile, fewer seats (--max-num-seqs) are fewer buckets to compile (1: batch-1
decode only, a cold start of about half a minute per configuration).

Each configuration gets a freshly loaded model (a model is quantized once, in place) and one
engine, which measures:
  batch-1 decode   one fixed prompt, greedy, EOS ignored: the first step (prefill) is not
                   timed, the next `--decode-tokens - 1` steps are: tokens / seconds, the
                   fastest of 5 runs (BATCH1_RUNS), every configuration and llama.cpp taking
                   turns (all engines are built first); and how many of its tokens match float32's.
  throughput       `throughput.py`'s seeded workload (small with --quick), output tokens / s.
  bandwidth floor  the weight bytes a batch-1 step reads (`weight_bytes_per_step`: every
                   linear in its stored form, the norms, one embedding row) over the read
                   bandwidth measured at the start: no batch-1 step can beat it.
With `--compile` every decode bucket is compiled before anything is timed; the cold start
takes minutes per configuration (seconds once the inductor cache in the minillm cache is warm),
reported as compile_s.

  prefill          time to first token of one 512-token prompt alone (`prefill.py`): seconds
                   and prompt tokens / s, the fastest of 3 runs, each a fresh prompt.

`--against llama.cpp` adds llama.cpp's row on the same model's GGUF (`against_llama_cpp.py`):
batch-1 decode through llama-cpp-python's high-level API, the throughput workload batched
through its low-level API (`llama_cpp_batched.py`: as many sequences at once as minillm's
--max-num-seqs), and the same 512-token prefill, with minillm / llama.cpp ratios.
llama-cpp-python is optional (`pip install llama-cpp-python`; it compiles llama.cpp).
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import platform
import time

import torch

from ..cli.engine_args import NO_QUANTIZATION, add_engine_arguments, engine_config_from_args
from ..engine.engine import LLMEngine
from ..sampling_params import SamplingParams
from .against_llama_cpp import (BATCH1_RUNS, LLAMA_CPP_HINT, LLAMA_CPP_ROW, batched_label,  # noqa: F401
                                batch1_llama_cpp, find_llama_cpp, measure_rest_llama_cpp, ratio_line)
from .ceiling import read_bandwidth_bytes_per_second
from .model_args import (add_model_arguments, is_dummy_run, label, load, print_header, resolve_model_args,
                         tokenizer_and_vocabulary)
from .prefill import prefill_prompts, timed_prefill
from .throughput import background_load, make_workload

PROMPT_TEXT = ("The history of the city goes back many centuries. Its first houses stood on the hill above "
               "the river, where traders met to exchange grain, salt and cloth. Over time")
QUANTIZATIONS = ("int8", "int4", "w4a8")


def configurations(compile: bool, quantizations=QUANTIZATIONS, compiled_only: bool = False) \
        -> list[tuple[str, str | None, bool]]:
    """(row name, quantization, compiled) for every minillm row; float32 always (the reference),
    eager. `compiled_only`: the quantized rows compiled, without their eager twins (every row is
    an engine held in memory until the batch-1 turns end: at 1B, four do not fit 24 GiB)."""
    eager = [("float32", None, False)] + [(q, q, False) for q in quantizations]
    if compile and compiled_only:
        return eager[:1] + [(f"{name}+compile", q, True) for name, q, _ in eager[1:]]
    return eager + ([(f"{name}+compile", q, True) for name, q, _ in eager] if compile else [])


def stored_bytes(module) -> int:
    """Bytes of a module's own persistent tensors (its children's not included): the weight in
    its stored form (float, or codes and scales) and bias. A copy re-laid for a faster kernel
    (PanelLinear's panels, the int8/int4 panels) is a non-persistent buffer, rebuilt from the
    stored form; the kernel reads it instead of the stored form, never both, so it is not added."""
    skip = module._non_persistent_buffers_set
    tensors = [*module._parameters.values(), *(b for n, b in module._buffers.items() if n not in skip)]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def weight_bytes_per_step(model) -> dict:
    """The weight bytes a batch-1 decode step reads, by part: the decoder layers' linears,
    the output head (the embedding table itself when tied) and the rest (norms, one embedding row)."""
    head = model.lm_head
    layers = other = 0
    for name, module in model.named_modules():
        if module is head or name == "" or next(module.children(), None) is not None:
            continue                                   # the head, the root and containers
        if isinstance(module, torch.nn.Embedding):
            other += module.weight[0].numel() * module.weight.element_size()
        elif hasattr(module, "in_features") and hasattr(module, "out_features"):
            layers += stored_bytes(module)
        else:
            other += stored_bytes(module)
    parts = {"layers": layers, "head": stored_bytes(head), "other": other}
    parts["total"] = sum(parts.values())
    return parts


def timed_decode_steps(engine, prompt_ids: list[int], num_tokens: int) -> tuple[float, list[int]]:
    """(seconds of the `num_tokens - 1` decode steps after the prefill step, the greedy tokens)."""
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    engine.add_request(f"batch1-{time.monotonic_ns()}", prompt_ids, params)
    engine.step()                                      # prefill: samples the first token, not timed
    start, outputs = time.perf_counter(), []
    while engine.has_unfinished_requests():
        outputs = engine.step() or outputs
    return time.perf_counter() - start, list(outputs[0].outputs[0].token_ids)


def compile_every_bucket(engine) -> float:
    """Run one decode step at each bucket size so that the compiled graphs exist before anything
    is timed (prompts of 3 distinct tokens: nothing for the prefix cache). Returns the seconds."""
    step = engine.runner.static_step
    start = time.perf_counter()
    for bucket in (step.buckets if step is not None else []):
        prompts = [[1000 + 3 * i, 1001 + 3 * i, 1002 + 3 * i] for i in range(bucket)]
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    return time.perf_counter() - start


def run_workload(engine, workload) -> float:
    """`throughput.run_minillm` on an engine already built (its compiled graphs are the engine's)."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in workload]
    start = time.perf_counter()
    outs = engine.generate([p for p, _ in workload], params)
    elapsed = time.perf_counter() - start
    assert sum(len(o.outputs[0].token_ids) for o in outs) == sum(n for _, n in workload)
    return sum(n for _, n in workload) / elapsed


def row_quantizations(args) -> tuple[str, ...]:
    """The quantized rows: all, the one --quantization names, or none (`--quantization none`)."""
    if args.quantization is None:
        return QUANTIZATIONS
    return () if args.quantization == NO_QUANTIZATION else (args.quantization,)


def build_minillm(args, quantization, compiled) -> dict:
    """One configuration's engine, its compiled buckets built, warmed up; its batch-1 runs come later."""
    config = engine_config_from_args(args, compile=compiled, quantization=quantization)
    model, tokenizer = load(args, device=config.device, dtype=config.dtype)
    engine = LLMEngine(model, tokenizer, config)
    compile_s = compile_every_bucket(engine) if compiled else 0.0
    fell_back = getattr(getattr(engine.runner.run_decode, "__self__", None), "failed", False)
    return {"engine": engine, "compile_s": compile_s, "compile_failed": fell_back,
            "bytes": weight_bytes_per_step(engine.model)}


def interleaved_batch1(runs: dict, num_tokens: int) -> dict:
    """{name: (tok/s, tokens)}: each `runs[name](num_tokens) -> (seconds, tokens)` run BATCH1_RUNS times, the
    configurations taking turns, the fastest run of each counted. Why turns: this VM's speed moves
    by +-10 % over minutes; run one after another, a ratio would compare two moments."""
    for run in runs.values():
        run(4)                                             # warm up: threads, caches, the prompt's blocks
    best = {}
    for _ in range(BATCH1_RUNS):
        for name, run in runs.items():
            seconds, tokens = run(num_tokens)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens)
    return {name: ((num_tokens - 1) / seconds, tokens) for name, (seconds, tokens) in best.items()}


def measure_rest(engine, workload, prompts) -> dict:
    """A configuration's throughput workload and 512-token prefill (after the batch-1 turns)."""
    first = timed_prefill(engine, prompts)
    return {"throughput": run_workload(engine, workload), "ttft_s": first["ttft_s"], "prefill": first["tok_per_s"]}


def agreement(tokens: list[int], reference: list[int]) -> float:
    """The fraction of the batch-1 tokens produced before the first one that differs from float32's."""
    same = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    return same / len(reference)


def machine_info(bandwidth: float, llama_cpp, load_at_start: float) -> dict:
    model_name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                       if line.startswith("model name")), platform.processor()) \
        if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"cpu": model_name, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "llama_cpp_python": getattr(llama_cpp, "__version__", None),
            "read_bandwidth_bytes_per_s": bandwidth, "load_per_core_at_start": load_at_start,
            "load_per_core_at_end": background_load()}


def print_table(report: dict) -> None:
    b1, tp, floor = report["batch1_decode_tok_s"], report["throughput_tok_s"], report["bandwidth_floor_tok_s"]
    pf = report["prefill_tok_s"]
    print(f"\n{'configuration':<16}{'weight MB':>10}{'floor tok/s':>13}{'batch-1 tok/s':>15}"
          f"{'% of floor':>12}{'throughput tok/s':>18}{'prefill tok/s':>15}{'compile s':>11}{'= float32':>11}")
    for name in b1:
        mb = report["weight_bytes_per_step"][name]["total"] / 1e6
        print(f"{name:<16}{mb:>10.1f}{floor[name]:>13.1f}{b1[name]:>15.1f}{100 * b1[name] / floor[name]:>11.0f}%"
              f"{tp[name]:>18.1f}{pf[name]:>15.1f}{report['compile_seconds'][name]:>11.1f}"
              f"{100 * report['greedy_agreement_with_float32'][name]:>10.0f}%")
    print(f"  (= float32: the share of the batch-1 greedy tokens made before the first that differs; "
          f"prefill: one {report['settings']['prefill_tokens']}-token prompt alone, to its first token)")
    for text in report["notes"]:
        print(f"  {text}")


def main(args) -> dict:
    torch.manual_seed(0)
    notes = []
    resolve_model_args(args)
    config = engine_config_from_args(args)               # a bad flag fails here, before loading
    print_header(args)
    llama_cpp, path = (find_llama_cpp(args.model, notes, args.load_format) if args.against == LLAMA_CPP_ROW
                       else (None, None))
    tokenizer, vocab_size = tokenizer_and_vocabulary(args)       # each configuration loads its own model
    prompt_ids = tokenizer.encode(PROMPT_TEXT)
    args.decode_tokens = args.decode_tokens or (32 if args.quick else 128)
    if args.quick:
        workload = make_workload(args.num_prompts or 8, args.seed, vocab_size, (16, 64), (8, 32))
    else:
        workload = make_workload(args.num_prompts or 64, args.seed, vocab_size)
    prompts = prefill_prompts(vocab_size, args.seed)
    load_at_start, bandwidth = background_load(), read_bandwidth_bytes_per_second(config.device)
    print(f"prompt {len(prompt_ids)} tokens, {args.decode_tokens} decode tokens; workload {len(workload)} "
          f"prompts, {sum(n for _, n in workload)} output tokens; prefill {len(prompts[0])} tokens; "
          f"read bandwidth {bandwidth / 1e9:.1f} GB/s; {torch.get_num_threads()} threads", flush=True)
    rows, runs = {}, {}
    for name, quantization, compiled in configurations(args.compile, row_quantizations(args), args.compiled_only):
        print(f"building {name}{' (compiling every bucket first: minutes when cold)' if compiled else ''}...",
              flush=True)
        rows[name] = build_minillm(args, quantization, compiled)
        runs[name] = functools.partial(timed_decode_steps, rows[name]["engine"], prompt_ids)
    llama = batch1_llama_cpp(llama_cpp, path, prompt_ids, args.decode_tokens) if path is not None else None
    if llama is not None:
        runs[LLAMA_CPP_ROW], rows[LLAMA_CPP_ROW] = llama["run"], {"bytes": llama["bytes"], "compile_s": 0.0}
    print(f"batch-1 decode, {BATCH1_RUNS} turns of {', '.join(runs)}...", flush=True)
    for name, (tok_s, tokens) in interleaved_batch1(runs, args.decode_tokens).items():
        rows[name] |= {"batch1": tok_s, "tokens": tokens}
    if llama is not None:
        llama["close"]()
    for name in [n for n in rows if n != LLAMA_CPP_ROW]:
        print(f"measuring {name}: throughput workload, prefill...", flush=True)
        rows[name] |= measure_rest(rows[name].pop("engine"), workload, prompts)
        gc.collect()        # the engine just measured holds reference cycles: free it before the next one runs
    if llama is not None:
        print(f"measuring {LLAMA_CPP_ROW} ({path.name}): throughput workload, prefill...", flush=True)
        rows[LLAMA_CPP_ROW] |= measure_rest_llama_cpp(llama_cpp, path, workload, prompts, config.max_num_seqs)
    notes += [f"{k}: torch.compile failed, the step ran eagerly (see the warning above)"
              for k, r in rows.items() if r.get("compile_failed")]
    if "int8" in rows:
        notes.append(f"int8 / float32 batch-1: {rows['int8']['batch1'] / rows['float32']['batch1']:.2f}x")
    if LLAMA_CPP_ROW in rows:
        notes.append(f"llama.cpp throughput: {batched_label(rows[LLAMA_CPP_ROW]['max_seqs'])}")
        notes += [ratio_line(label, rows, key) for key, label in
                  (("batch1", "batch-1"), ("throughput", "throughput (batched)"), ("prefill", "prefill"))]
    report = {"batch1_decode_tok_s": {k: r["batch1"] for k, r in rows.items()},
              "throughput_tok_s": {k: r["throughput"] for k, r in rows.items()},
              "prefill_tok_s": {k: r["prefill"] for k, r in rows.items()},
              "ttft_s": {k: r["ttft_s"] for k, r in rows.items()},
              "bandwidth_floor_tok_s": {k: bandwidth / r["bytes"]["total"] for k, r in rows.items()},
              "weight_bytes_per_step": {k: r["bytes"] for k, r in rows.items()},
              "compile_seconds": {k: r["compile_s"] for k, r in rows.items()},
              "greedy_agreement_with_float32": {k: agreement(r["tokens"], rows["float32"]["tokens"])
                                                for k, r in rows.items()},
              "machine": machine_info(bandwidth, llama_cpp, load_at_start),
              "settings": {"model": label(args), "dummy_weights": is_dummy_run(args), "prompt_tokens": len(prompt_ids),
                           "decode_tokens": args.decode_tokens, "num_prompts": len(workload), "seed": args.seed,
                           "quick": args.quick, "prefill_tokens": len(prompts[0]),
                           "engine_options": dataclasses.asdict(config),
                           "llama_cpp_throughput": batched_label(rows[LLAMA_CPP_ROW]["max_seqs"])
                           if LLAMA_CPP_ROW in rows else None},
              "notes": notes}
    print_table(report)
    if is_dummy_run(args):
        print(f"  model: {label(args)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--quick", action="store_true", help="a small workload and fewer decode tokens")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--against", choices=[LLAMA_CPP_ROW], default=None,
                   help="also run the embedded model's GGUF through llama-cpp-python, if installed")
    p.add_argument("--decode-tokens", type=int, default=None, help="batch-1 tokens (default 128, 32 with --quick)")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compiled-only", action="store_true",
                   help="with --compile: the quantized rows compiled only, float32 eager as the reference "
                        "(fewer engines in memory at once: what fits at 1B)")
    add_engine_arguments(p, device="cpu", dtype="float32")
