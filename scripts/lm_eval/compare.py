"""lm-eval through the server against lm-eval on the checkpoint itself, on a local task.

    .venv/bin/pip install "lm-eval[api]"    # not a dependency of minillm: a client people use
    .venv/bin/python scripts/lm_eval/compare.py [--model PATH]

Runs the multiple-choice task in facts.jsonl (48 questions, no download) twice: once with
lm-eval's `local-completions` model against `python -m minillm serve` (each choice scored
by echo + logprobs, the server's prompt logprobs) and once with lm-eval's `hf` model on the
same checkpoint in float32. Prints both accuracies and the largest difference between the
two runs' loglikelihoods; exits 1 if the accuracies differ or a loglikelihood differs by
more than 1e-3 (float32 rounding stays far below it).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
TASK = """task: minillm_facts
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", model, "--port", str(port),
                               "--served-model-name", "served", "--dtype", "float32"])
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            sys.exit("the server exited")
        time.sleep(0.5)
    server.kill()
    sys.exit("the server did not start")


def evaluate(model: str, model_args: str, include_path: str) -> tuple[float, list[float]]:
    import lm_eval
    from lm_eval.tasks import TaskManager
    results = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["minillm_facts"],
                                      task_manager=TaskManager(include_path=include_path), log_samples=True,
                                      batch_size=8)
    samples = sorted(results["samples"]["minillm_facts"], key=lambda s: s["doc_id"])
    loglikelihoods = [float(r[0][0]) for s in samples for r in s["resps"]]
    return results["results"]["minillm_facts"]["acc,none"], loglikelihoods


def main() -> int:
    from minillm.models.embedded import embedded_checkpoint_dir
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: the embedded model)")
    args = parser.parse_args()
    model = args.model or str(embedded_checkpoint_dir())
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tasks:
        Path(tasks, "minillm_facts.yaml").write_text(TASK.format(data=HERE / "facts.jsonl"))
        port = free_port()
        server = start_server(model, port)
        try:
            served = evaluate("local-completions", f"model=served,base_url=http://127.0.0.1:{port}/v1/completions,"
                              f"tokenizer_backend=huggingface,tokenizer={model},num_concurrent=1,max_retries=1",
                              tasks)
        finally:
            server.terminate()
            server.wait(30)
        hf = evaluate("hf", f"pretrained={model},dtype=float32,device=cpu", tasks)
    diff = max(abs(a - b) for a, b in zip(served[1], hf[1]))
    print(f"\nlocal-completions via minillm: acc {served[0]:.4f} ({len(served[1])} loglikelihoods)")
    print(f"hf on the checkpoint:          acc {hf[0]:.4f} ({len(hf[1])} loglikelihoods)")
    print(f"largest loglikelihood difference: {diff:.2e}")
    same = served[0] == hf[0] and len(served[1]) == len(hf[1]) and diff < 1e-3
    print("same" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
