"""A KV pool the machine cannot hold is refused before anything is allocated, with the numbers
and the fix (a ValueError), never the allocator's raw error or the OOM killer."""
import pytest

from minillm import LLMEngine
from minillm.engine.resolved_config import available_bytes

from conftest import get_model


@pytest.mark.parametrize("options", [dict(num_kv_blocks=10**9), dict(kv_cache_memory_bytes=10**15),
                                     dict(num_kv_blocks=1000, preemption_mode="swap", swap_space=10**9)])
def test_a_pool_past_the_machine_is_refused_with_the_budget(options):
    model, tokenizer, _ = get_model("tiny-llama")
    with pytest.raises(ValueError, match=r"does not fit host memory: .* GiB is available .* lower num_kv_blocks"):
        LLMEngine(model, tokenizer, **options)


def test_the_budget_is_reported_and_the_engine_still_builds_after_a_refusal():
    model, tokenizer, _ = get_model("tiny-llama")
    with pytest.raises(ValueError):
        LLMEngine(model, tokenizer, num_kv_blocks=10**9)
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4, preemption_mode="swap")
    memory = engine.stats()["config"]["memory"]
    assert memory["kv_pool"] == 64 * engine.kv_cache.k[0][0].numel() * 4 * 2 * model.config.num_hidden_layers
    assert memory["swap"] == memory["kv_pool"] and 0 < memory["weights"] < memory["available_host"]
    assert available_bytes(engine.resolved.device) > 0


def test_metrics_report_the_budget():
    from minillm.server.app import build_app
    from minillm.server.run import serve_in_thread, stop_server
    import httpx
    model, tokenizer, _ = get_model("tiny-llama")
    srv = serve_in_thread(build_app(LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4), "tiny-llama"))
    try:
        text = httpx.get(srv.url + "/metrics", timeout=30).text
    finally:
        stop_server(srv)
    for part in ("weights", "kv_pool", "swap", "available_host"):
        assert f'minillm:memory_bytes{{part="{part}"}}' in text, text[:2000]
