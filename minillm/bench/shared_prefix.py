"""`bench serve --workload shared-prefix`: where routing by cached prefix pays.

Several long system prompts (one per "application"), many users of each asking a short
question, arriving interleaved (Poisson, seeded). A server with one engine reuses each system
prompt's KV blocks after its first request; N replicas do only if the router keeps each system
prompt's users on the replica that has it. With `--data-parallel-size N` (N > 1) the workload
runs against a one-engine server, then against N replicas once per router policy (or only
`--router-policy`), each on fresh servers, and reports per run:

  hit rate   prompt tokens found in the prefix cache / prompt tokens, from the replicas' own
             metrics (data_parallel/metrics.py) read before and after the run;
  TTFT       p50 / p99 (serve.py's client clock), and the throughput.

On a machine with few cores N replicas share them: expect them slower than one engine there;
the hit rate is the point. Each rate gets its own system prompts, so no run reuses another's cache.
Requests sent all at once (rate inf) prefill in the same steps and none can reuse another's
blocks, whatever the routing: hence the default rates 1 and 4.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile

import httpx

from ..cli.engine_args import engine_argv
from ..server.data_parallel.metrics import hit_rate_between, prefix_cache_tokens
from ..server.data_parallel.router import POLICIES
from .load import run_load, served_model, summarize
from .server_process import ServerProcess, free_port, minillm_command

WORDS = ("request replica prefix cache token block kernel batch engine router latency memory answer "
         "schedule prompt model weight layer attention query value key stream server client policy").split()
TOPICS = ("billing", "shipping", "returns", "accounts", "warranty", "recipes", "travel", "homework")


def shared_prefix_workload(num_systems: int, users_per_system: int, system_words: int, max_tokens: int,
                           seed: int) -> list[tuple[str, int]]:
    """(prompt, max_tokens) pairs: each system prompt followed by one user's short question,
    the users of all system prompts shuffled together."""
    rng = random.Random(seed)
    prompts = []
    for s in range(num_systems):
        topic = TOPICS[s % len(TOPICS)]
        system = (f"You are the {topic} assistant #{seed}-{s}. Follow these notes: " +
                  " ".join(rng.choice(WORDS) for _ in range(system_words)) + ".")
        for u in range(users_per_system):
            question = f"I am user {u}. What should I know about {rng.choice(WORDS)} {rng.choice(WORDS)}?"
            prompts.append((f"{system}\n\nUser: {question}\nAssistant:", max_tokens))
    rng.shuffle(prompts)
    return prompts


def scrape(url: str) -> dict:
    return prefix_cache_tokens(httpx.get(f"{url}/metrics", timeout=30).text)


def runs(args) -> list[tuple[str, list[str]]]:
    """(label, extra serve flags) per server to start: one engine, then each policy's replicas."""
    n = args.data_parallel_size
    if n == 1:
        return [("1 engine", [])]
    policies = [args.router_policy] if args.router_policy else list(POLICIES)
    return [("1 engine", [])] + [(f"{n}x {p}", ["--data-parallel-size", str(n), "--router-policy", p])
                                 for p in policies]


COLUMNS = [("server", 18, "{}"), ("rate", 6, "{:g}"), ("done", 6, "{}"), ("hit rate", 9, "{:.3f}"),
           ("TTFT p50", 9, "{:.3f}"), ("p99", 7, "{:.3f}"), ("req/s", 7, "{:.2f}"), ("tok/s", 8, "{:.1f}")]
KEYS = ["server", "rate", "completed", "prefix_cache_hit_rate", "ttft_p50", "ttft_p99", "request_throughput",
        "output_throughput"]


def main(args) -> dict:
    flags = engine_argv(args)
    if flags and args.url:
        raise ValueError(f"engine flags ({' '.join(flags)}) configure the servers bench serve starts; "
                         "with --url it starts none")
    systems, users, words, max_tokens = (2, 4, 60, 4) if args.quick else (4, 12, 300, 32)
    if args.num_prompts:
        users = max(1, args.num_prompts // systems)
    print(f"shared-prefix workload: {systems} system prompts of {words} words, {users} users each, "
          f"{max_tokens} tokens per answer, rates {args.request_rate}, max concurrency {args.max_concurrency}")
    print("".join(title.rjust(width) for title, width, _ in COLUMNS))
    rows = []
    for label, extra in ([("server", None)] if args.url else runs(args)):
        server = None
        if extra is not None:
            port = args.port or free_port()
            log = os.path.join(tempfile.gettempdir(), f"minillm-bench-shared-prefix-{port}.log")
            server = ServerProcess(minillm_command(args.model, port, flags + extra), port, log=log)
        with server or _Running(args.url) as live:
            model = served_model(live.url)
            for k, rate in enumerate(args.request_rate):
                prompts = shared_prefix_workload(systems, users, words, max_tokens, args.seed + k)
                before = scrape(live.url)
                results, elapsed = asyncio.run(run_load(live.url, model, prompts, rate, args.max_concurrency,
                                                        args.seed))
                row = {"server": label, "rate": rate, **summarize(results, elapsed, args.slo_ttft, args.slo_tpot),
                       "prefix_cache_hit_rate": hit_rate_between(before, scrape(live.url))}
                rows.append(row)
                print("".join(fmt.format(row[key]).rjust(width) for (_, width, fmt), key in zip(COLUMNS, KEYS)),
                      flush=True)
    report = {"workload": {"name": "shared-prefix", "system_prompts": systems, "users_per_system": users,
                           "system_words": words, "max_tokens": max_tokens, "seed": args.seed, "quick": args.quick},
              "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


class _Running:
    """A server someone else runs (--url), with ServerProcess's face."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
