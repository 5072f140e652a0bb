"""Shared fixtures: models are loaded once per session (the embedded one takes seconds)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Property tests explore the same examples every run: a failure is reproducible, never flaky.
settings.register_profile("deterministic", derandomize=True, deadline=None, database=None)
settings.load_profile("deterministic")

# Triton reads TRITON_INTERPRET when a kernel is defined; on a machine without CUDA its kernels
# run only under the interpreter. Set it before any test module can import triton (the Triton
# tests and lesson 08's graders import it at collection, in whatever order xdist hands out files).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minillm.models import load_model
from minillm.models.reference import transformers_twin

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

_CACHE = {}


def get_model(name):
    if name not in _CACHE:
        model, tokenizer = load_model(name, device="cpu")
        _CACHE[name] = (model, tokenizer, transformers_twin(model))
    return _CACHE[name]


@pytest.fixture(scope="session")
def smol():
    """(our model, tokenizer, transformers twin) for the embedded SmolLM2-135M-Instruct."""
    return get_model("SmolLM2-135M-Instruct")


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def tiny(request):
    return get_model(request.param)


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "List three colors:",
]


def run_without_a_compiler(script: str, cache) -> list[str]:
    """Run `script` in a fresh Python whose C and C++ compilers are `false` and whose minillm
    cache holds no compiled kernel, as on a machine with no compiler; return its stdout lines
    (fails on a crash). The cache does hold the converted embedded model (a link to this
    machine's, when it has one): the tokenizer comes from it, and converting the GGUF again
    would take a minute and prove nothing about compilers."""
    from minillm.models.embedded import EMBEDDED_NAME, embedded_checkpoint_dir
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    converted = embedded_checkpoint_dir()
    if converted is not None and not (cache / EMBEDDED_NAME).exists():
        (cache / EMBEDDED_NAME).symlink_to(converted.resolve(), target_is_directory=True)
    env = dict(os.environ, CC="false", CXX="false", MINILLM_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


# Files that take minutes, by the seconds of their last `--durations` (one worker). `make test`
# hands files to its two xdist workers in collection order (`--no-loadscope-reorder`): these go
# first, the others after, most tests first (xdist's own default order). A long file handed out
# last would leave one worker running it alone at the end.
SLOW_FILES = {
    "tests/test_grade.py": 330, "tests/test_grade_sandbox.py": 240, "tests/test_colab_binder.py": 120,
    "solutions/10_beyond_one_machine.ipynb": 100, "tests/test_multinode.py": 70,
    "tests/test_tensor_parallel.py": 60, "tests/test_quant_quality.py": 55,
    "solutions/11_speculative_decoding.ipynb": 45,
}


@pytest.hookimpl(trylast=True)            # after pytest's own reordering (by fixture parameters)
def pytest_collection_modifyitems(config, items):
    files = [item.nodeid.split("::")[0] for item in items]
    count = {f: files.count(f) for f in set(files)}
    order = {f: (-SLOW_FILES.get(f, 0), -count[f], files.index(f)) for f in count}
    items[:] = [item for _, item in sorted(zip(files, items), key=lambda pair: order[pair[0]])]
