"""The C kernels' torch ops in C++ (torch_ops.cpp): a call costs what a native op costs.

Why: a `torch.ops.minillm.*` op whose CPU kernel is Python (define_op's ctypes call) costs
~9 us a call inside a compiled decode step (inductor -> dispatcher -> Python -> ctypes), and a
batch-1 step of SmolLM2 makes 210 linear calls. With the C++ wrapper registered as the op's CPU
kernel the dispatcher calls straight into C++ and then the C function: 5.4 us a call instead
of 11.3 in a compiled graph, 4.5-7 us instead of 8-11 eagerly (quant/speed.py's docstring has
the figures, rough: measured on a busy machine).

How: torch_ops.cpp is compiled once per torch version (and its own source) with the system C++
compiler against torch's headers (`torch.utils.cpp_extension.include_paths()`; only the light
ones: <torch/library.h>, <ATen/core/Tensor.h>, not <torch/extension.h>), cached in the minillm
cache and loaded with `torch.ops.load_library`. Cold compile: 7 s on the 2-core EPYC when
quiet, 15 s with other jobs running (once per cache: a CI run pays it once, two pytest workers
share one build through a file lock); a warm load is under 1 ms. Not cpp_extension.load:
that needs ninja and builds a Python module; this is one compiler call, as CKernel's are.

The C kernels stay in their own libraries, built by CKernel with their flags; `enable(op,
address)` hands the C++ wrapper the C function's address (ctypes knows it) and registers the
wrapper as `minillm::<op>`'s CPU kernel. So the .cpp does not depend on the C files' cache keys,
and an op whose C kernel did not build keeps its Python fallback. No C++ compiler, no torch
headers, or MINILLM_NO_CPP_OPS=1: `enable` returns False (`load_error` says why), and every op
stays on its Python+ctypes implementation.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .paths import cache_dir

SOURCE = Path(__file__).with_name("torch_ops.cpp")
DISABLE = "MINILLM_NO_CPP_OPS"            # set to 1: never build or load the C++ ops
load_error = ""                          # why the C++ ops are not there ("" when they are, or untried)
_state = {"tried": False, "loaded": False}
_lock = threading.Lock()


def _command(cxx: str, output: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [cxx, "-O2", "-std=c++20", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{p}" for p in include_paths()), str(SOURCE), "-o", str(output),
            *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch_cpu",
            *(f"-Wl,-rpath,{p}" for p in library_paths())]


def build() -> Path:
    """Compile torch_ops.cpp into the cache (reused while torch, the source and the compiler match)."""
    cxx = os.environ.get("CXX", "c++")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(
        [cxx, torch.__version__, torch.__file__, *_command(cxx, Path("x"))]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"torch_ops-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)     # a second process waits for the first one's build
        except ImportError:                      # not POSIX: both build, os.replace keeps it safe
            pass
        if not target.exists():
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                subprocess.run(_command(cxx, built), check=True, capture_output=True, timeout=600)
                os.replace(built, target)        # atomic: nobody loads half a file
    return target


def load() -> bool:
    """Build (first time) and load the C++ ops; False with `load_error` set when they cannot be."""
    global load_error
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            if os.environ.get(DISABLE, "") not in ("", "0"):
                load_error = f"disabled by {DISABLE}"
                return False
            try:
                torch.ops.load_library(str(build()))
                _state["loaded"] = True
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                detail = getattr(e, "stderr", b"") or b""
                load_error = f"{e} {detail.decode(errors='replace')[-500:]}".strip()
    return _state["loaded"]


def enable(op: str, address: int) -> bool:
    """Make the C++ wrapper of `minillm::<op>` its CPU kernel, calling the C function at `address`.
    The op's schema must be defined first (define_op). False if the C++ ops are not there, or
    torch_ops.cpp has no wrapper for this op (it then keeps its Python kernel)."""
    return load() and torch.ops.minillm_native.set_kernel(op, address)
