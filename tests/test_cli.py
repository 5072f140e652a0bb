"""The command line, run as a user would: a real subprocess."""
import json
import subprocess
import sys

import pytest


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_generate_chat_answers_paris():
    r = run("generate", "--chat", "What is the capital of France?", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_generate_bad_model_is_a_clear_error():
    r = run("generate", "hi", "--model", "no-such-model")
    assert r.returncode == 2
    assert "unknown model 'no-such-model'" in r.stderr


def test_generate_bad_sampling_value_is_a_clear_error():
    r = run("generate", "hi", "--model", "tiny-llama", "--top-p", "0")
    assert r.returncode == 2
    assert "SamplingParams.top_p must be" in r.stderr


def test_bench_throughput_quick_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    r = run("bench", "throughput", "--model", "tiny-llama", "--quick", "--num-prompts", "4",
            "--json", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    names = [x["name"] for x in report["results"]]
    assert names[0] == "minillm" and any("transformers" in n for n in names)
    useful = {x["output_tokens"] for x in report["results"]}
    assert len(useful) == 1                       # everyone produced the same useful tokens
    assert report["ratio"] > 0
    assert "ratio minillm / best transformers" in r.stdout


def test_bench_kv_cache_runs_and_agrees():
    r = run("bench", "kv-cache", "--model", "tiny-llama", "--prompt-tokens", "32", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "speed-up of the cache" in r.stdout
