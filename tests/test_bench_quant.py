"""`bench quant`: the weight bytes behind each bandwidth floor, counted by hand, and a quick run
on a tiny model with llama-cpp-python hidden (the suite never needs it)."""
import json
import sys

import pytest

from minillm.__main__ import main as cli
from minillm.bench.ceiling import layer_matmul_params
from minillm.bench.quant import LLAMA_CPP_HINT, weight_bytes_per_step
from minillm.models import load_model
from minillm.models.loader import place_model
from minillm.quant import quantize_model

ROWS = ("float32", "int8", "int4", "w4a8")


def tiny_model(method=None):
    model, _ = load_model("tiny-llama", device="cpu")
    model = place_model(model, "cpu")                    # as the engine lays it out (PanelLinear head)
    return quantize_model(model, method) if method else model


def test_float32_bytes_are_every_linear_weight_the_head_and_the_norms():
    model = tiny_model()
    c = model.config
    got = weight_bytes_per_step(model)
    assert got["layers"] == 4 * c.num_hidden_layers * layer_matmul_params(c) == 294_912
    assert got["head"] == 4 * c.vocab_size * c.hidden_size             # PanelLinear's panels not counted twice
    norms = 4 * (2 * c.num_hidden_layers + 1) * c.hidden_size
    assert got["other"] == norms + 4 * c.hidden_size                    # + the one embedding row looked up
    assert got["total"] == got["layers"] + got["head"] + got["other"]


def test_int8_layers_read_a_byte_per_weight_plus_a_scale_per_output_channel():
    float32 = weight_bytes_per_step(tiny_model())
    int8_model = tiny_model("int8")
    c = int8_model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    rows_per_layer = 2 * q + 2 * kv + 2 * c.intermediate_size + c.hidden_size   # q o k v gate up down
    got = weight_bytes_per_step(int8_model)
    assert got["layers"] == c.num_hidden_layers * (layer_matmul_params(c) + 4 * rows_per_layer)
    assert 0.25 < got["layers"] / float32["layers"] < 0.28
    if not int8_model.quantization_options["include_head"]:
        assert got["head"] == float32["head"]


def test_int4_layers_read_half_a_byte_per_weight_plus_a_scale_and_zero_per_group():
    float32 = weight_bytes_per_step(tiny_model())
    got = weight_bytes_per_step(tiny_model("int4"))
    # group 32, float32 scale and zero: 0.5 + 8 / 32 bytes per weight, against 4
    assert got["layers"] == pytest.approx(float32["layers"] * (0.5 + 8 / 32) / 4, rel=1e-9)


def test_quick_run_without_llama_cpp_hints_and_still_measures_every_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)          # `import llama_cpp` raises ImportError
    out = tmp_path / "quant.json"
    assert cli(["bench", "quant", "--model", "tiny-llama", "--quick", "--against", "llama.cpp",
                "--decode-tokens", "8", "--num-prompts", "4", "--max-num-seqs", "2", "--json", str(out)]) == 0
    assert LLAMA_CPP_HINT in capsys.readouterr().out
    report = json.loads(out.read_text())
    for key in ("batch1_decode_tok_s", "throughput_tok_s", "bandwidth_floor_tok_s", "weight_bytes_per_step",
                "prefill_tok_s", "ttft_s"):
        assert set(report[key]) == set(ROWS), key
        assert all(v["total"] > 0 if isinstance(v, dict) else v > 0 for v in report[key].values()), key
    bandwidth = report["machine"]["read_bandwidth_bytes_per_s"]
    for row in ROWS:
        floor = report["bandwidth_floor_tok_s"][row] * report["weight_bytes_per_step"][row]["total"]
        assert floor == pytest.approx(bandwidth)
    agreement = report["greedy_agreement_with_float32"]
    assert agreement["float32"] == 1.0 and all(0 <= v <= 1 for v in agreement.values())
    b = report["weight_bytes_per_step"]
    assert b["int4"]["layers"] < b["int8"]["layers"] < b["float32"]["layers"]
    assert b["w4a8"]["head"] == b["int4"]["head"]               # the same weights; w4a8 stores its
    assert b["w4a8"]["layers"] == pytest.approx(b["int4"]["layers"] * 0.625 / 0.75)   # scales in float16
    assert report["machine"]["llama_cpp_python"] is None and LLAMA_CPP_HINT in report["notes"]
    assert report["settings"]["engine_options"]["max_num_seqs"] == 2
    assert report["settings"]["prefill_tokens"] == 512 and report["settings"]["llama_cpp_throughput"] is None
    for row in ROWS:                                              # one 512-token prompt to its first token
        assert report["prefill_tok_s"][row] == pytest.approx(512 / report["ttft_s"][row])


def test_compiled_only_keeps_the_float32_reference_and_drops_the_eager_twins():
    from minillm.bench.quant import configurations
    assert configurations(True, ("w4a8",)) == [("float32", None, False), ("w4a8", "w4a8", False),
                                               ("float32+compile", None, True), ("w4a8+compile", "w4a8", True)]
    assert configurations(True, ("w4a8",), compiled_only=True) == [("float32", None, False),
                                                                  ("w4a8+compile", "w4a8", True)]
    assert configurations(False, ("int8",), compiled_only=True) == [("float32", None, False), ("int8", "int8", False)]
