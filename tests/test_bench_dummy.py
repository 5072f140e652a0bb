"""The benches on dummy weights (--hf-config): they run, say so, and bench serve drives
llama.cpp's llama-server on the same weights where one is at hand."""
import argparse
import json
import os
import shutil

import pytest

from minillm.bench import quant, serve, throughput
from minillm.bench.llama_server import find_llama_server, llama_server_command
from minillm.models.dummy import DUMMY_MARK

TINY = dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("shape") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def parse(module, argv):
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return p.parse_args(argv)


def llama_server():
    path = os.environ.get("MINILLM_LLAMA_SERVER") or shutil.which("llama-server")
    return path if path and os.access(path, os.X_OK) else None


def test_throughput_runs_a_dummy_shape_and_marks_it(tiny_config, capsys):
    report = throughput.main(parse(throughput, ["--hf-config", tiny_config, "--quick", "--num-prompts", "2",
                                                "--skip-transformers"]))
    assert report["dummy_weights"] and DUMMY_MARK in report["model"]
    assert report["results"][0]["output_tokens"] > 0 and report["ratio"] is None
    assert DUMMY_MARK in capsys.readouterr().out


def test_quant_runs_a_dummy_shape_and_marks_it(tiny_config):
    report = quant.main(parse(quant, ["--hf-config", tiny_config, "--quick", "--num-prompts", "2",
                                      "--quantization", "none", "--decode-tokens", "6"]))
    assert report["settings"]["dummy_weights"] and DUMMY_MARK in report["settings"]["model"]
    assert report["batch1_decode_tok_s"]["float32"] > 0


def test_serve_against_llama_cpp_side_by_side(tiny_config):
    argv = ["--hf-config", tiny_config, "--quick", "--num-prompts", "2", "--request-rate", "inf",
            "--max-num-seqs", "2"]
    against = llama_server() is not None
    if against:
        argv += ["--against", "llama.cpp", "--llama-server", llama_server(), "--gguf-type", "F32"]
    report = serve.main(parse(serve, argv))
    assert report["dummy_weights"] and [r["completed"] for r in report["rows"]] == [2] * (2 if against else 1)
    assert report["served_models"]["minillm"] == f"dummy-weights/{tiny_config}"          # /v1/models says so
    if against:
        ours, theirs = report["rows"]
        assert theirs["server"] == "llama.cpp" and ours["output_throughput"] > 0 and theirs["output_throughput"] > 0
        assert set(report["ratios"]["inf"]) >= {"output_throughput", "ttft_p99", "tpot_p50", "itl_p99"}


def test_llama_server_command_and_a_missing_binary():
    command = llama_server_command("/bin/llama-server", "m.gguf", 8080, parallel=4, threads=2, ctx_per_slot=1024)
    assert command[command.index("--parallel") + 1] == "4" and command[command.index("--ctx-size") + 1] == "4096"
    assert "--cont-batching" in command
    with pytest.raises(FileNotFoundError, match="not an executable"):
        find_llama_server("/nonexistent/llama-server")
    args = parse(serve, ["--model-shape", "smollm2-135m", "--against", "transformers"])
    with pytest.raises(ValueError, match="llama.cpp"):
        serve.main(args)
