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
    assert names[0] == "minillm float32" and any("transformers" in n for n in names)
    useful = {x["output_tokens"] for x in report["results"]}
    assert len(useful) == 1                       # everyone produced the same useful tokens
    assert report["ratio"] > 0
    assert "ratio minillm / best transformers" in r.stdout


def test_bench_kv_cache_runs_and_agrees():
    r = run("bench", "kv-cache", "--model", "tiny-llama", "--prompt-tokens", "32", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "speed-up of the cache" in r.stdout


def test_serve_prints_its_url_and_answers_with_the_key_from_the_environment():
    import os
    import re
    import signal

    import httpx

    env = dict(os.environ, MINILLM_API_KEY="k123")
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "tiny-llama", "--port", "0",
                             "--num-kv-blocks", "64", "--max-model-len", "256", "--no-enable-prefix-caching"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        for line in proc.stdout:               # blocks until the server says it is ready
            lines.append(line)
            url = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
            if url:
                break
        assert url, "".join(lines)
        url = url.group(1)
        assert httpx.get(url + "/v1/models").status_code == 401
        auth = {"Authorization": "Bearer k123"}
        (card,) = httpx.get(url + "/v1/models", headers=auth).json()["data"]
        assert card["id"] == "tiny-llama" and card["max_model_len"] == 256
        r = httpx.post(url + "/v1/completions", headers=auth, timeout=60,
                       json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}).json()
        assert r["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGINT)            # Ctrl-C
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0
    assert "Finished server process" in rest and "Traceback" not in rest, rest


def test_serve_bad_engine_option_is_a_clear_error():
    r = run("serve", "--model", "tiny-llama", "--block-size", "0")
    assert r.returncode == 2
    assert "EngineConfig.block_size must be" in r.stderr


def test_bench_serve_quick_measures_a_real_server(tmp_path):
    """bench serve starts `minillm serve` in its own process, sends a seeded Poisson workload,
    and reports per-rate latency percentiles; every request completes."""
    out = tmp_path / "serve.json"
    r = run("bench", "serve", "--quick", "--model", "tiny-llama", "--request-rate", "4", "inf",
            "--num-prompts", "6", "--json", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [row["rate"] for row in rows] == [4.0, float("inf")]
    for row in rows:
        assert row["completed"] == 6 and row["failed"] == 0, row
        assert 0 < row["ttft_p50"] <= row["ttft_p99"] and row["output_throughput"] > 0
        assert row["goodput"] <= row["request_throughput"]
    assert "TTFT p50" in r.stdout


def test_bench_serve_structured_reports_the_masks_cost(tmp_path):
    """--structured json: the same workload with a schema per request beside the plain one, the
    ratio of the two and the grammar compile times, in one run; every constrained answer parses."""
    out = tmp_path / "serve.json"
    r = run("bench", "serve", "--quick", "--model", "tiny-llama", "--request-rate", "inf", "--num-prompts", "4",
            "--structured", "json", "--json", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert [row["server"] for row in report["rows"]] == ["minillm", "minillm+json"]
    assert all(row["completed"] == 4 and row["failed"] == 0 for row in report["rows"]), report["rows"]
    overhead = report["ratios"]["structured"]
    assert overhead["inf"]["output_throughput"] > 0
    assert 0 < overhead["grammar"]["compile_ms_p50"] <= overhead["grammar"]["compile_ms_p99"]
    assert "minillm+json / minillm" in r.stdout and "grammar compile" in r.stdout


def test_bench_spec_quick_writes_the_speedup_table(tmp_path):
    """bench spec: batch-1 tok/s with and without the n-gram proposer on both workloads, beside
    transformers' prompt lookup, and a batch of 8; it fails itself if speculation changed a token."""
    out = tmp_path / "spec.json"
    r = run("bench", "spec", "--quick", "--model", "tiny-llama", "--max-tokens", "8", "--draft-model", "tiny-qwen2",
            "--json", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert set(report["speedup"]["ngram"]) == set(report["speedup"]["draft_model"]) == {"input_grounded", "open_ended"}
    assert all(v > 0 for v in report["speedup"]["ngram"].values())
    assert report["transformers"]["open_ended"]["prompt_lookup_tok_s"] > 0 and "8" in report["batched"]
    assert "prompt lookup" in r.stdout


def test_bench_serve_arrivals_and_percentiles():
    from minillm.bench.serve import percentile, poisson_arrivals, summarize
    times = poisson_arrivals(1000, 10.0, seed=1)
    assert times == poisson_arrivals(1000, 10.0, seed=1) and times == sorted(times)
    assert 80 < times[-1] < 120                               # 1000 arrivals at 10/s take ~100 s
    assert poisson_arrivals(3, float("inf"), 0) == [0.0, 0.0, 0.0]
    assert percentile([3, 1, 2, 4], 50) in (2, 3) and percentile([5], 99) == 5
    results = [{"sent": 0.0, "chunks": [1.0, 1.5, 2.0], "tokens": 3, "error": None},
               {"sent": 0.0, "chunks": [], "tokens": 0, "error": "HTTP 503"}]
    s = summarize(results, elapsed=4.0, slo_ttft=2.0, slo_tpot=0.1)
    assert s["completed"] == 1 and s["failed"] == 1 and s["ttft_p50"] == 1.0 and s["tpot_p50"] == 0.5
    assert s["goodput"] == 0 and s["output_throughput"] == 3 / 4 and s["first_error"] == "HTTP 503"
