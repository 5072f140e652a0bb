"""Prometheus metrics at GET /metrics, with vLLM's names under the `minillm:` prefix.

Two kinds:
  - gauges of the engine's state (queue lengths, KV blocks, prefix-cache hit rate) and its
    preemption count. Only the engine loop thread may read the engine, so the loop leaves a
    snapshot after every step (`AsyncEngine.snapshot`) and a collector reads that at scrape
    time;
  - per-request latencies and token counts, timed on the asyncio side as outputs arrive:
    TTFT (time to first token), ITL (time between tokens), end-to-end latency.
Each app has its own CollectorRegistry (not prometheus_client's global one), so a process
(a test run) can hold several apps.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class EngineCollector:
    """Reads the engine loop's latest snapshot when Prometheus scrapes."""

    def __init__(self, front):
        self.front = front

    def collect(self):
        s = self.front.snapshot
        gauges = [
            ("num_requests_running", "Sequences in the running batch", s.get("num_running", 0)),
            ("num_requests_waiting", "Sequences waiting to be scheduled", s.get("num_waiting", 0)),
            ("num_requests_swapped", "Sequences swapped out to CPU memory", s.get("num_swapped", 0)),
            ("kv_blocks_used", "KV cache blocks in use", s.get("kv_blocks_used", 0)),
            ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)",
             s.get("kv_blocks_used", 0) / max(1, s.get("kv_blocks_total", 1))),
            ("prefix_cache_hit_rate", "Fraction of prefix-cache lookups that hit",
             s.get("prefix_cache_hit_rate", 0.0)),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(f"minillm:{name}", doc, value=value)
        memory = GaugeMetricFamily("minillm:memory_bytes", "The memory budget checked when the engine was built: "
                                   "weights, KV pool, swap space, and what the device had available",
                                   labels=["part"])
        for part, value in s.get("config", {}).get("memory", {}).items():
            memory.add_metric([part], value)
        yield memory
        yield CounterMetricFamily("minillm:num_preemptions", "Sequences preempted so far",
                                  value=s.get("num_preemptions", 0))
        yield CounterMetricFamily("minillm:engine_restarts", "Tensor-parallel groups started again after a rank died",
                                  value=self.front.restarts)
        yield GaugeMetricFamily("minillm:engine_ready", "1 while the engine can serve (GET /health answers 200)",
                                value=0 if self.front.unavailable() else 1)
        if "spec_proposed_tokens" in s:               # with --speculative-config
            yield CounterMetricFamily("minillm:spec_decode_num_draft_tokens", "Drafted tokens verified",
                                      value=s["spec_proposed_tokens"])
            yield CounterMetricFamily("minillm:spec_decode_num_accepted_tokens", "Drafted tokens accepted",
                                      value=s["spec_accepted_tokens"])
            yield GaugeMetricFamily("minillm:spec_decode_acceptance_rate", "Accepted / drafted tokens",
                                    value=s["spec_acceptance_rate"])
            yield GaugeMetricFamily("minillm:spec_decode_mean_accepted_length",
                                    "Drafts accepted per verification", value=s["spec_mean_accepted_length"])


class Metrics:
    def __init__(self, front):
        self.registry = registry = CollectorRegistry()
        registry.register(EngineCollector(front))
        self.ttft = Histogram("minillm:time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram("minillm:inter_token_latency_seconds", "Time between a request's tokens",
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram("minillm:e2e_request_latency_seconds", "Request latency, arrival to finish",
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.prompt_tokens = Counter("minillm:prompt_tokens", "Prompt tokens processed", registry=registry)
        self.generation_tokens = Counter("minillm:generation_tokens", "Tokens generated", registry=registry)
        self.finished = Counter("minillm:request_success", "Completions (choices) finished, by finish reason",
                                ["finished_reason"], registry=registry)

    def clock(self) -> "RequestClock":
        """A clock for one engine request, started now."""
        return RequestClock(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestClock:
    """Times one engine request from the outputs it receives (each carries all its tokens)."""

    def __init__(self, metrics: Metrics):
        self.metrics, self.start = metrics, time.monotonic()
        self.last: float | None = None      # when the latest token arrived
        self.tokens = 0

    def observe(self, out) -> None:
        now, m = time.monotonic(), self.metrics
        tokens = sum(len(o.token_ids) for o in out.outputs)
        if tokens > self.tokens:
            if self.last is None:
                m.ttft.observe(now - self.start)
                m.prompt_tokens.inc(len(out.prompt_token_ids))
            else:
                m.itl.observe(now - self.last)
            m.generation_tokens.inc(tokens - self.tokens)
            self.last, self.tokens = now, tokens
        if out.finished:
            m.e2e.observe(now - self.start)
            for o in out.outputs:
                m.finished.labels(finished_reason=str(o.finish_reason)).inc()
