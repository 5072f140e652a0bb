"""`bench roofline`: a decode step's bytes and FLOPs counted by hand, and a quick run."""
import json

from minillm.__main__ import main as cli
from minillm.bench.ceiling import read_bandwidth_bytes_per_second
from minillm.bench.roofline import decode_step_bytes, decode_step_flops, roofline_seconds
from minillm.config import ModelConfig

SMALL = dict(vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=2)


def test_decode_step_bytes_count_weights_kv_read_and_kv_written():
    c = ModelConfig(**SMALL)
    # batch 3, 5 tokens cached each, 2-byte dtype. Per layer: q, o 4x4; k, v 4x2; MLP 3 x 4x6;
    # two RMSNorms of 4. Then the head 10x4, the final norm 4, and 3 embedding rows of 4.
    per_layer = (16 + 8 + 8 + 16) + 3 * 24 + 2 * 4
    weights = 2 * (2 * per_layer + 10 * 4 + 4 + 3 * 4)
    kv_per_token = 2 * 2 * (1 * 2) * 2               # layers x (K, V) x kv heads * head_dim x bytes
    expected = {"weights": weights, "kv_read": 3 * (5 + 1) * kv_per_token, "kv_written": 3 * kv_per_token}
    expected["total"] = sum(expected.values())
    assert decode_step_bytes(c, 3, 5, 2) == expected == {"weights": 624, "kv_read": 288, "kv_written": 48,
                                                         "total": 960}


def test_decode_step_bytes_count_qwen_biases_and_qk_norms():
    plain = decode_step_bytes(ModelConfig(**SMALL), 1, 0, 4)["weights"]
    qwen2 = decode_step_bytes(ModelConfig(**SMALL, attention_bias=True, model_type="qwen2"), 1, 0, 4)["weights"]
    qwen3 = decode_step_bytes(ModelConfig(**SMALL, qk_norm=True, model_type="qwen3"), 1, 0, 4)["weights"]
    assert qwen2 - plain == 4 * 2 * (4 + 2 + 2)       # q, k, v biases in both layers, float32
    assert qwen3 - plain == 4 * 2 * (2 + 2)           # q and k norms of head_dim in both layers


def test_decode_step_flops_count_projections_attention_and_head():
    c = ModelConfig(**SMALL)
    per_token = 2 * 120 * 2 + 4 * 4 * (5 + 1) * 2 + 2 * 4 * 10   # layers' matmuls, attention, head
    assert decode_step_flops(c, 3, 5) == 3 * per_token == 2256


def test_roofline_is_the_slower_of_memory_and_compute():
    assert roofline_seconds(1e9, 1e9, bandwidth=1e9, peak_flops=1e12) == 1.0       # memory-bound
    assert roofline_seconds(1e6, 1e12, bandwidth=1e9, peak_flops=1e11) == 10.0     # compute-bound


def test_read_bandwidth_is_a_positive_measurement():
    assert 1e8 < read_bandwidth_bytes_per_second("cpu", 2 ** 24, seconds=0.05) < 1e13


def test_quick_run_writes_json_and_picture(tmp_path):
    out, png = tmp_path / "roofline.json", tmp_path / "roofline.png"
    assert cli(["bench", "roofline", "--model", "tiny-llama", "--quick", "--backends", "torch",
                "--batch-sizes", "1", "4", "--json", str(out), "--plot", str(png)]) == 0
    report = json.loads(out.read_text())
    assert {"model", "device", "dtype", "context", "bandwidth_bytes_per_s", "peak_flops_per_s",
            "rows"} <= report.keys()
    assert report["dtype"] == "float32" and report["device"] == "cpu"       # "auto" on CPU
    assert [(r["batch_size"], r["backend"]) for r in report["rows"]] == [(1, "torch"), (4, "torch")]
    for r in report["rows"]:
        assert {"weights", "kv_read", "kv_written", "total"} <= r["bytes"].keys()
        assert r["bound"] in ("memory", "compute") and r["measured_ms"] > 0
        # a tiny model's weights can stay in cache, so the fraction may pass 1 here; the bound
        # only catches a ratio turned upside down or a unit slip (x1000)
        assert 0 < r["fraction_of_roofline"] < 20
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
