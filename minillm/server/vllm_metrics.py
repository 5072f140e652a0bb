"""The server's metrics again under vLLM's names, with vLLM's `model_name` label, so vLLM's
example Grafana dashboard and autoscalers (KEDA, the Kubernetes HPA on a Prometheus adapter)
read this server unchanged. Same counters as metrics.py (one source of truth), renamed at
scrape time:

    minillm:num_requests_running / _waiting / _swapped -> vllm:num_requests_running / _waiting / _swapped
    minillm:kv_cache_usage_perc          -> vllm:kv_cache_usage_perc and vllm:gpu_cache_usage_perc (the older name)
    minillm:prompt_tokens_total          -> vllm:prompt_tokens_total
    minillm:generation_tokens_total      -> vllm:generation_tokens_total
    minillm:request_success_total        -> vllm:request_success_total  {finished_reason}
    minillm:num_preemptions_total        -> vllm:num_preemptions_total
    minillm:time_to_first_token_seconds  -> vllm:time_to_first_token_seconds
    minillm:inter_token_latency_seconds  -> vllm:inter_token_latency_seconds and vllm:time_per_output_token_seconds
    minillm:e2e_request_latency_seconds  -> vllm:e2e_request_latency_seconds
    minillm:spec_decode_num_(draft|accepted)_tokens -> vllm:spec_decode_num_(draft|accepted)_tokens
"""
from __future__ import annotations

from prometheus_client.metrics_core import Metric

from .metrics import EngineCollector

RENAMES = {
    "num_requests_running": ["num_requests_running"], "num_requests_waiting": ["num_requests_waiting"],
    "num_requests_swapped": ["num_requests_swapped"],
    "kv_cache_usage_perc": ["kv_cache_usage_perc", "gpu_cache_usage_perc"],
    "prompt_tokens": ["prompt_tokens"], "generation_tokens": ["generation_tokens"],
    "request_success": ["request_success"], "num_preemptions": ["num_preemptions"],
    "time_to_first_token_seconds": ["time_to_first_token_seconds"],
    "inter_token_latency_seconds": ["inter_token_latency_seconds", "time_per_output_token_seconds"],
    "e2e_request_latency_seconds": ["e2e_request_latency_seconds"],
    "spec_decode_num_draft_tokens": ["spec_decode_num_draft_tokens"],
    "spec_decode_num_accepted_tokens": ["spec_decode_num_accepted_tokens"],
}


class VllmNames:
    """A collector that re-emits the metrics above as vllm:* with model_name. It reads the
    sources directly (not the registry it is registered in, which would collect itself)."""

    def __init__(self, metrics, front, model_name: str):
        self.sources = [EngineCollector(front), metrics.ttft, metrics.itl, metrics.e2e, metrics.prompt_tokens,
                        metrics.generation_tokens, metrics.finished]
        self.model_name = model_name

    def collect(self):
        for source in self.sources:
            for family in source.collect():
                short = family.name.removeprefix("minillm:")
                for name in RENAMES.get(short, []):
                    out = Metric(f"vllm:{name}", family.documentation, family.type)
                    for s in family.samples:
                        if s.name.endswith("_created"):
                            continue
                        out.add_sample(f"vllm:{name}{s.name[len(family.name):]}",
                                       {**s.labels, "model_name": self.model_name}, s.value, s.timestamp)
                    yield out
