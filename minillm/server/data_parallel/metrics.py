"""GET /metrics on the front: every replica's metrics, labelled `replica="i"`, their totals
(`replica="total"`), and the router's own counters.

Totals are sums (requests, tokens, latency histograms' buckets add up across replicas),
except for ratios: the KV usage and speculation rates are averaged, and the prefix-cache hit
rate is weighted by each replica's prompt tokens (hits = rate x prompt tokens, summed, over
the prompt tokens summed), the one number that says how well routing keeps prefixes together.
`prefix_cache_tokens` reads those hits back per replica (bench serve, the tests). When you
aggregate in Prometheus, leave the total out: `sum(x{replica!="total"})`.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

TOTAL = "total"
HIT_RATE = "minillm:prefix_cache_hit_rate"
PROMPT_TOKENS = "minillm:prompt_tokens_total"
AVERAGED = {"minillm:kv_cache_usage_perc", "minillm:spec_decode_acceptance_rate",
            "minillm:spec_decode_mean_accepted_length",
            "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}          # vLLM's names (vllm_metrics.py)
NOT_ADDED = {("minillm:memory_bytes", "available_host")}      # the replicas share one machine's memory


class RouterMetrics:
    """The router's counters: requests routed per replica and policy, what the router believed
    was cached where, failures, restarts; and, read at scrape time, in flight and up per replica."""

    def __init__(self, router):
        self.registry = registry = CollectorRegistry()
        self.router = router
        self.requests = Counter("minillm:router_requests", "Requests routed, by replica and policy",
                                ["replica", "policy"], registry=registry)
        self.prompt_chars = Counter("minillm:router_prompt_chars", "Prompt characters routed", ["replica"],
                                    registry=registry)
        self.matched_chars = Counter("minillm:router_matched_prefix_chars", "Prompt characters the router "
                                     "believed cached on the replica it chose", ["replica"], registry=registry)
        self.failures = Counter("minillm:router_replica_failures", "Requests a replica failed to answer "
                                "(it died, dropped the connection or went silent)", ["replica"], registry=registry)
        self.restarts = Counter("minillm:router_replica_restarts", "Times the front started a replica again "
                                "after it exited", ["replica"], registry=registry)
        for i in range(len(router.up)):                 # 0 from the start, not absent until the first
            self.failures.labels(replica=str(i))
            self.restarts.labels(replica=str(i))
        registry.register(_RouterState(router))

    def routed(self, route, policy: str) -> None:
        i = str(route.replica)
        self.requests.labels(replica=i, policy=policy).inc()
        self.prompt_chars.labels(replica=i).inc(route.prompt_chars)
        self.matched_chars.labels(replica=i).inc(route.matched_chars)

    def failed(self, replica: int) -> None:
        self.failures.labels(replica=str(replica)).inc()

    def restarted(self, replica: int) -> None:
        self.restarts.labels(replica=str(replica)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RouterState:
    def __init__(self, router):
        self.router = router

    def collect(self):
        in_flight = GaugeMetricFamily("minillm:router_in_flight", "Requests in flight per replica", labels=["replica"])
        up = GaugeMetricFamily("minillm:router_replica_up", "1 while the replica is in rotation", labels=["replica"])
        for i, (n, alive) in enumerate(zip(self.router.in_flight, self.router.up)):
            in_flight.add_metric([str(i)], n)
            up.add_metric([str(i)], float(alive))
        yield in_flight
        yield up


def merge(texts: dict[int, str]) -> bytes:
    """The replicas' metrics (Prometheus text by replica index) as one text: each sample
    labelled with its replica, then each family's totals."""
    families: dict[str, Metric] = {}
    for i, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            out = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            out.samples += [s._replace(labels={**s.labels, "replica": str(i)}) for s in family.samples]
    weights = {s.labels["replica"]: s.value for f in families.values() for s in f.samples if s.name == PROMPT_TOKENS}
    for family in families.values():
        family.samples += totals(family, weights)
    return generate_latest(_Families(list(families.values())))


def totals(family: Metric, prompt_tokens: dict[str, float]) -> list:
    groups: dict[tuple, list] = {}
    for s in family.samples:
        labels = {k: v for k, v in s.labels.items() if k != "replica"}
        if s.name.endswith("_created") or (family.name, labels.get("part")) in NOT_ADDED:
            continue
        groups.setdefault((s.name, tuple(sorted(labels.items()))), []).append(s)
    out = []
    for (name, labels), samples in groups.items():
        values = [s.value for s in samples]
        if name == HIT_RATE:
            weights = [prompt_tokens.get(s.labels["replica"], 0.0) for s in samples]
            value = sum(v * w for v, w in zip(values, weights)) / sum(weights) if sum(weights) else 0.0
        elif name in AVERAGED:
            value = sum(values) / len(values)
        else:
            value = sum(values)
        out.append(samples[0]._replace(labels={**dict(labels), "replica": TOTAL}, value=value))
    return out


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def prefix_cache_tokens(text: str) -> dict[str, tuple[float, float]]:
    """Per replica (its label; "0" for a single server's unlabelled metrics): (prompt tokens
    found in the prefix cache, prompt tokens), read from /metrics. Totals left out. The hit
    rate of a run is the change in the first over the change in the second."""
    rates, prompts = {}, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            replica = s.labels.get("replica", "0")
            if replica != TOTAL and s.name == HIT_RATE:
                rates[replica] = s.value
            elif replica != TOTAL and s.name == PROMPT_TOKENS:
                prompts[replica] = s.value
    return {r: (rates.get(r, 0.0) * prompts[r], prompts[r]) for r in prompts}


def hit_rate_between(before: dict, after: dict) -> float:
    """The prefix-cache hit rate of what happened between two `prefix_cache_tokens` readings."""
    hits = sum(after[r][0] - before.get(r, (0.0, 0.0))[0] for r in after)
    prompts = sum(after[r][1] - before.get(r, (0.0, 0.0))[1] for r in after)
    return hits / prompts if prompts else 0.0
