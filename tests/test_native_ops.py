"""The C kernels' torch ops in C++ (minillm/utils/native_ops.py, torch_ops.cpp) against their ctypes path.

Each op, called through torch.ops.minillm.* with its C++ wrapper as CPU kernel, must give the
very same numbers as the ctypes call of the same C function (the same code runs: a difference
would mean a wrong argument). Bad tensors are refused with a ValueError naming the op. Without
the C++ build (MINILLM_NO_CPP_OPS=1, or no C++ compiler) every op still runs, on ctypes.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from minillm.attention import cpu_paged
from minillm.models import cpu_linear
from minillm.quant import kernels, w4a8
from minillm.quant.speed import TINY_CALL, op_cases
from minillm.utils import native_ops

KERNELS = {"panel_linear": cpu_linear.KERNEL, "int8_linear": kernels.KERNEL, "int4_linear": kernels.KERNEL,
           "w4a8_linear": w4a8.KERNEL, "paged_decode_attention": cpu_paged.KERNEL}
have_c = all(kernel.load() is not None for kernel in KERNELS.values())
needs_cpp = pytest.mark.skipif(not (have_c and native_ops.load()),
                               reason=f"C kernels or C++ ops not built: {native_ops.load_error}")


def test_cpp_ops_build_where_a_cxx_compiler_exists():
    if not have_c or shutil.which(os.environ.get("CXX", "c++")) is None or os.environ.get(native_ops.DISABLE):
        pytest.skip("no C or C++ compiler here (or disabled): the ops run their ctypes fallback")
    assert native_ops.load(), native_ops.load_error
    for op, kernel in KERNELS.items():
        assert kernel.native, op
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"minillm::{op}", "CPU"), op   # the C++ one
    assert not native_ops.enable("not_a_kernel", 1)        # no wrapper in torch_ops.cpp: stays Python


@needs_cpp
@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("op", list(KERNELS))
def test_cpp_op_and_ctypes_give_identical_outputs(op, rows):
    by_ctypes, by_op, args = op_cases(rows, (576, 192))[op]
    with torch.inference_mode():
        expected = by_ctypes(*args)
        assert torch.equal(by_op(*args), expected)
    assert torch.equal(by_op(*args), expected)                 # outside inference_mode too
    assert expected.abs().sum() > 0


@needs_cpp
@pytest.mark.parametrize("op", list(KERNELS))
def test_cpp_ops_are_well_formed_torch_ops(op):
    _, by_op, args = op_cases(3, *TINY_CALL)[op]
    torch.library.opcheck(by_op.default, args, test_utils=("test_schema", "test_faketensor"))


@needs_cpp
def test_eager_wrappers_call_the_cpp_op(monkeypatch):
    def no_ctypes(*args):
        raise AssertionError("ctypes path taken where the C++ op is built")
    for module, name in ((kernels, "int8_ctypes"), (kernels, "int4_ctypes"), (w4a8, "w4a8_ctypes"),
                         (cpu_linear, "run_kernel"), (cpu_paged, "run_kernel")):
        monkeypatch.setattr(module, name, no_ctypes)
    cases = op_cases(2, (64, 32))
    kernels.int8_matmul(*cases["int8_linear"][2])
    kernels.int4_matmul(*cases["int4_linear"][2])
    w4a8.w4a8_matmul(*cases["w4a8_linear"][2])
    cpu_paged.attend(*cases["paged_decode_attention"][2])
    panel = cpu_linear.PanelLinear(torch.nn.Linear(64, 32), cpu_linear.load_kernel())
    panel(torch.randn(2, 64))


@needs_cpp
def test_bad_tensors_are_refused_with_a_clear_error():
    _, _, (x, panels, scale) = op_cases(2, (64, 32))["int8_linear"]
    with pytest.raises(ValueError, match=r"minillm::int8_linear: panels must be \[N / 32, K, 32\]"):
        torch.ops.minillm.int8_linear(torch.randn(2, 96), panels, scale)          # K 96, panels for 64
    with pytest.raises(ValueError, match="minillm::int8_linear: x must be a 2-d Float CPU tensor, got 2-d Double"):
        torch.ops.minillm.int8_linear(x.double(), panels, scale)
    with pytest.raises(ValueError, match="minillm::int8_linear: scale must be contiguous"):
        torch.ops.minillm.int8_linear(x, panels, scale.repeat(2)[::2])
    _, _, (q, k, v, tables, positions) = op_cases(2, *TINY_CALL)["paged_decode_attention"]
    with pytest.raises(ValueError, match="block_tables must be a 2-d Long CPU tensor, got 2-d Int"):
        torch.ops.minillm.paged_decode_attention(q, k, v, tables.int(), positions)
    with pytest.raises(ValueError, match="one row per query"):
        torch.ops.minillm.paged_decode_attention(q, k, v, tables[:1], positions)


FALLBACK = """
import torch
from minillm.quant import kernels
from minillm.quant.speed import op_cases
from minillm.utils import native_ops
assert kernels.load_kernels() is not None, kernels.load_error
assert not kernels.KERNEL.native and not native_ops.load()
for op, (by_ctypes, by_op, args) in op_cases(3, (64, 32)).items():
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"minillm::{op}", "CPU"), op
    assert torch.equal(by_op(*args), by_ctypes(*args)), op
print(native_ops.load_error)
"""


@pytest.mark.skipif(not have_c, reason="no C compiler: no kernels, no ops to fall back from")
@pytest.mark.parametrize("env", [{native_ops.DISABLE: "1"}, {"CXX": "false"}])
def test_without_the_cpp_build_every_op_runs_on_ctypes(env):
    """The C kernels come from this process's cache; the C++ build is refused (CXX=false: a
    different cache key, so it is really attempted and fails)."""
    out = subprocess.run([sys.executable, "-c", FALLBACK], env=dict(os.environ, **env), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert ("disabled by" if native_ops.DISABLE in env else "false") in out.stdout
