"""`python -m minillm.bench.step_profile`: a decode step's time by operator."""
from minillm.bench.step_profile import profile_decode
from minillm.engine.engine import LLMEngine

from conftest import get_model


def test_the_profile_lists_the_steps_operators_and_leaves_no_request_behind():
    model, tokenizer, _ = get_model("tiny-llama")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4)
    result = profile_decode(engine, batch=2, context=6, steps=3)
    assert result["step_ms"] > 0
    names = [name for name, _, _ in result["ops"]]
    assert any("linear" in name or "mm" in name for name in names), names[:20]
    assert all(ms >= 0 and calls > 0 for _, ms, calls in result["ops"])
    assert [ms for _, ms, _ in result["ops"]] == sorted((ms for _, ms, _ in result["ops"]), reverse=True)
    assert not engine.has_unfinished_requests()
    assert engine.stats()["kv_blocks_used"] == 0 or engine.config.enable_prefix_caching
