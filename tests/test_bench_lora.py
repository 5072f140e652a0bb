"""`bench lora` (minillm/bench/lora.py) at a tiny scale: its rows, its tokens, its memory figures.
A smoke run on the tiny model, not a measurement: the speeds it prints are not checked."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minillm.bench.lora import run_bench
from minillm.bench.throughput import make_workload
from minillm.config import EngineConfig
from minillm.lora.adapter import load_adapter
from minillm.lora.merge import merged_copy, weight_bytes
from minillm.models import load_model
from minillm.models.reference import compare_greedy, transformers_twin

pytest.importorskip("peft")
COUNTS, DELTAS = [1, 3], ["grouped", "packed"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    model, tok = load_model("tiny-llama")
    workload = make_workload(6, 0, model.config.vocab_size, (8, 40), (4, 10))
    root = tmp_path_factory.mktemp("adapters")
    out = run_bench(model, tok, EngineConfig(num_kv_blocks=256), workload, COUNTS, DELTAS, root=root, std=0.5)
    return model, workload, out


def test_rows_are_base_then_lora_per_delta_then_merged(report):
    _, workload, out = report
    names = [(r["name"], r["adapters"]) for r in out["rows"]]
    want = [("base model", 0)]
    for n in COUNTS:
        want += [(f"LoRA batched, {d}", n) for d in DELTAS] + [("merged, one after another", n)]
    assert names == want
    for r in out["rows"]:
        assert r["output_tokens"] == sum(n for _, n in workload) and r["tok_per_s"] > 0 and r["ratio_to_base"] > 0
        assert [len(t) for t in r["tokens"]] == [n for _, n in workload]


def test_lora_rows_give_the_merged_models_tokens(report):
    """Request i under adapter i % n: batched LoRA's greedy tokens are those of the adapter merged
    into the weights (up to a float rounding tie, judged on the merged model in transformers)."""
    model, workload, out = report
    rows = out["rows"]
    base = rows[0]["tokens"]
    for n in COUNTS:
        merged = next(r for r in rows if r["name"].startswith("merged") and r["adapters"] == n)
        assert sum(t != b for t, b in zip(merged["tokens"], base)) >= len(base) - 1, "adapters change the answer"
        for r in (r for r in rows if r["name"].startswith("LoRA") and r["adapters"] == n):
            for i, (ours, want) in enumerate(zip(r["tokens"], merged["tokens"])):
                if ours != want:
                    a = out["adapters"][i % n]
                    adapter = load_adapter(a["path"], model.config.num_hidden_layers, SHAPES(model), a["rank"])
                    compare_greedy(transformers_twin(merged_copy(model, adapter)), workload[i][0], ours, want)


def SHAPES(model):
    from minillm.bench.lora import shapes
    return shapes(model.config)


def test_memory_figures_follow_from_the_shapes(report):
    """An adapter's bytes are r * (in + out) * 4 per adapted module per layer; a merged copy is the model."""
    model, _, out = report
    shapes, layers = SHAPES(model), model.config.num_hidden_layers
    for a, got in zip(out["adapters"], out["memory"]["adapter_bytes"]):
        assert got == sum(a["rank"] * (shapes[m][0] + shapes[m][1]) * 4 for m in a["targets"]) * layers
    assert out["memory"]["merged_copy_bytes"] == weight_bytes(model) > 50 * max(out["memory"]["adapter_bytes"])
    lora = [r for r in out["rows"] if r["name"].startswith("LoRA") and r["adapters"] == 3]
    rank = max(a["rank"] for a in out["adapters"][:3])
    assert lora[0]["slot_bytes"] == sum(rank * (o + i) * 4 for o, i in shapes.values()) * layers


def test_cli_quick_run_writes_its_json(tmp_path):
    path = tmp_path / "lora.json"
    r = subprocess.run([sys.executable, "-m", "minillm", "bench", "lora", "--quick", "--model", "tiny-llama",
                        "--adapters", "2", "--num-prompts", "4", "--delta", "packed", "--json", str(path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for text in ("machine:", "torch threads", "LoRA batched, packed", "merged, one after another",
                 "memory per adapter", "goal: 2 adapters >= 0.8x"):
        assert text in r.stdout, (text, r.stdout)
    report = json.loads(path.read_text())
    assert [row["name"] for row in report["rows"]] == ["base model", "LoRA batched, packed", "merged, one after another"]
    assert report["rows"][1]["same_tokens_as_merged"] >= 3     # all 4 here; one may be a rounding tie elsewhere


def test_ops_per_decode_step_are_counted(report):
    """The dispatcher's count of one decode step (the same on every machine): adapters add
    operations, the packed delta fewer than the grouped one (a few calls per linear, not per adapter)."""
    ops = report[2]["ops_per_decode_step"]
    assert ops["adapters"] == 3 and ops["batch"] == 6
    assert ops["base"] < ops["packed"] < ops["grouped"]
