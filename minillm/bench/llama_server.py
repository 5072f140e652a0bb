"""llama.cpp's own OpenAI-compatible server (`llama-server`) as `bench serve`'s peer.

It is what people run to serve a model on a CPU: `--parallel N` slots (N requests decoded together
in one batch), continuous batching (a slot freed is refilled at once, prompts prefilled beside
running decodes), a KV cache shared by the slots. It runs the same weights as minillm: the
embedded model's own GGUF, or with dummy weights the same seeded weights written as a GGUF
(models/gguf_export.py).

llama-server is not a Python package: give its path (`--llama-server PATH`) or put it on PATH.
Building it from the llama.cpp that llama-cpp-python 0.3.36 vendors (README, "Benchmarks"):

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release \\
          -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \\
          $AMX_FREE_CMAKE_ARGS                      # against_llama_cpp.py: ggml's AMX path crashes
    cmake --build build --target llama-server -j   # -> build/bin/llama-server
"""
from __future__ import annotations

import os
import shutil

CTX_PER_SLOT = 1024        # the serve workload's longest prompt (512) + output (256), with room for re-tokenizing
HINT = ("llama-server not found: give --llama-server PATH or put it on PATH (README, 'Benchmarks', says how "
        "to build it from the llama.cpp that llama-cpp-python vendors)")


def find_llama_server(path: str | None = None) -> str:
    """The llama-server executable: `path`, else on PATH; a clear error otherwise."""
    found = path or shutil.which("llama-server")
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise FileNotFoundError(HINT if not path else f"--llama-server {path}: not an executable file")
    return found


def llama_server_command(exe: str, gguf, port: int, parallel: int, threads: int,
                         ctx_per_slot: int = CTX_PER_SLOT) -> list[str]:
    """`parallel` slots of `ctx_per_slot` tokens each, continuous batching on, `threads` threads
    for decode and prefill, on 127.0.0.1:`port`."""
    return [exe, "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(parallel), "--ctx-size", str(parallel * ctx_per_slot), "--cont-batching",
            "--threads", str(threads), "--threads-batch", str(threads),
            "--batch-size", "2048", "--ubatch-size", "512", "--no-webui"]
