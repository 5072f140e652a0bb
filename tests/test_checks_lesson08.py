"""Tests of lesson 08's grader (minillm.checks.lesson08): `check_paged_decode_kernel`.

The package's kernel passes, and planted mistakes — each one line of that kernel changed,
the way learners get it wrong — are rejected with the hint that names the problem. The
kernels are defined here from the package kernel's source, after TRITON_INTERPRET is set
(Triton picks interpreter or compiler when a @triton.jit function is defined), so they run
on the CPU whatever imported triton before. Addressable: `pytest -k check_paged_decode_kernel`.
"""
import inspect
import linecache
import os
from pathlib import Path

import nbformat
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before any kernel below is defined

pytest.importorskip("triton")
from checks_support import rejects  # noqa: E402

from minillm.attention import triton_decode  # noqa: E402
from minillm.checks import check_paged_decode_kernel  # noqa: E402
from minillm.course.build import stub_source  # noqa: E402

SOURCE = inspect.getsource(triton_decode.paged_decode_kernel.fn)
SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "08_going_fast.ipynb"


def kernel_from(source: str, name: str, function: str = "paged_decode_kernel"):
    """Define the @triton.jit function in `source` now (the interpreter on a CPU). Triton reads
    a kernel's source back with inspect, so the text is registered with linecache first."""
    filename = f"<lesson08 test kernel {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"triton": triton_decode.triton, "tl": triton_decode.tl}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[function]


def planted(name: str, *edits: tuple[str, str]):
    """The package's kernel with each (old, new) edit made: one planted mistake."""
    source = SOURCE
    for old, new in edits:
        assert source.count(old) == 1, f"{name}: {old!r} is not (once) in paged_decode_kernel any more"
        source = source.replace(old, new)
    return kernel_from(source, name)


def test_the_package_kernel_passes(capsys):
    assert check_paged_decode_kernel(kernel_from(SOURCE, "reference"))
    assert "passed (8 cases)" in capsys.readouterr().out


MISTAKES = {
    "every sequence reads row 0 of the block table": (
        [("block_tables_ptr + seq * stride_tb + tokens // block_size", "block_tables_ptr + tokens // block_size")],
        "two sequences.*its own row of the block table"),
    "the block table is ignored (blocks assumed in order)": (
        [("blocks = tl.load(block_tables_ptr + seq * stride_tb + tokens // block_size, mask=ok, other=0)",
          "blocks = seq * 0 + tokens // block_size")],
        "two sequences.*block_tables\\[seq, j // block_size\\]"),
    "the scores past the sequence's end are not masked": (
        [('s = tl.where(ok[None, :], s, float("-inf"))', "s = s")],
        "one sequence of 16 tokens.*mask the loads, set their scores to -inf"),
    "query heads mapped to KV heads by h % num_kv_heads": (
        [("heads = kv_head * GROUP + g", "heads = g * tl.num_programs(1) + kv_head")],
        "GQA.*h // GROUP"),
    "l and acc are not rescaled when the running max grows": (
        [("l = l * rescale + tl.sum(p, 1)", "l = l + tl.sum(p, 1)"),
         ("acc = acc * rescale[:, None] + tl.dot", "acc = acc + tl.dot")],
        "several tiles.*rescale what you summed so far by exp\\(m - m_new\\)"),
    "exp of the raw scores (no max subtracted)": (
        [("p = tl.exp(s - m_new[:, None])", "p = tl.exp(s)"),
         ("rescale = tl.exp(m - m_new)", "rescale = tl.full([BLOCK_G], 1.0, tl.float32)")],
        "large scores.*(inf or nan|subtract the running max)"),
    "every split walks the whole context": (
        [("for tile in range(start, end, BLOCK_N):", "for tile in range(0, seq_len, BLOCK_N):"),
         ("ok = tokens < end", "ok = tokens < seq_len")],
        "not by splitting the context.*start \\.\\. end"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # numpy's overflow, under the interpreter
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_check_paged_decode_kernel_rejects(mistake):
    edits, hint = MISTAKES[mistake]
    rejects(check_paged_decode_kernel, planted(mistake, *edits), match=f"(?s){hint}")


def test_the_lessons_stub_says_it_is_not_implemented():
    """The kernel exactly as lessons/08 hands it out: the solution's cell, stubbed by the build."""
    nb = nbformat.read(str(SOLUTION), as_version=4)
    cell = next(c.source for c in nb.cells if c.cell_type == "code" and "def my_paged_decode_kernel(" in c.source)
    stub = kernel_from(stub_source(cell), "stub", "my_paged_decode_kernel")
    rejects(check_paged_decode_kernel, stub, match="not implemented yet")


def test_not_a_triton_kernel_is_named():
    def plain(*args):
        pass
    rejects(check_paged_decode_kernel, plain, match="@triton.jit")


def test_a_different_signature_is_named():
    renamed = planted("renamed", ("k_cache_ptr, v_cache_ptr, block_tables_ptr", "k_ptr, v_cache_ptr, block_tables_ptr"),
                      ("tl.load(k_cache_ptr", "tl.load(k_ptr"))
    rejects(check_paged_decode_kernel, renamed, match="keep the signature")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a compiled kernel runs where there is a GPU")
def test_a_kernel_compiled_on_a_cpu_only_machine_gets_the_restart_hint(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    compiled = kernel_from(SOURCE, "compiled")
    rejects(check_paged_decode_kernel, compiled, match="TRITON_INTERPRET")
