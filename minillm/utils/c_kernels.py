"""A small C kernel, declared once: built with the system C compiler, loaded with ctypes, made a torch op.

The CPU kernels (paged attention, the linears of models/ and quant/) are single C files next to
the Python that calls them. Each declares itself as a `CKernel`: its source, the C functions
Python calls with their ctypes types, and any compiler flags it prefers. On first `load()` it
is compiled into the minillm cache, keyed by its source, the flags, the compiler and this CPU,
so an edit or a new machine rebuilds it and everything else reuses the file. No compiler:
`load()` returns None, `load_error` says why, and the caller takes its torch path.

`define_op` then makes the kernel a torch op, so torch.compile keeps it in its graph. Its CPU
kernel is C++ where it can be (native_ops.py: a wrapper in torch_ops.cpp, given the C
function's address when `load()` succeeds; `kernel.native` is then True), else the Python
function handed to define_op, which calls the C function with ctypes.

Adding a kernel (say `fused_norm`, C function `rms_norm_residual` in models/fused_norm.c):
  1. KERNEL = CKernel(source, {"rms_norm_residual": ([PTR, INT, ...], None)}) and a Python
     function that calls it with ctypes (the fallback, and the eager path without C++);
  2. define_op("fused_norm(Tensor x, ...) -> Tensor", python_fn, fake_fn, KERNEL, "rms_norm_residual");
  3. in torch_ops.cpp: the C signature as a pointer type `fused_norm_c`, a wrapper `fused_norm`
     (TORCH_CHECK_VALUE its tensors, allocate the output, call fused_norm_c) and one line
     `MINILLM_KERNEL(fused_norm)` in KERNELS. Without step 3 the op stays on its Python path.
  Call `torch.ops.minillm.fused_norm(...)` where `kernel.native` (or while compiling), the
  ctypes function otherwise. Tests: an entry in quant/speed.py's `op_cases` (the ctypes call,
  the op, arguments) and in tests/test_native_ops.py's KERNELS check the two give equal outputs.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from . import native_ops
from .paths import cache_dir

# Best first: vectorized for this machine and multi-threaded, then more portable builds.
FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3"])
# The linear kernels' extra flags: full-width AVX-512 registers, multiply-adds fused.
MATMUL_FLAGS = ("-mprefer-vector-width=512", "-ffp-contract=fast")
# ctypes types of the C arguments: a tensor's data_ptr(), an int, a float.
PTR, INT, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def _this_cpu() -> str:
    """What -march=native compiled for: a cache shared by different machines must not mix them."""
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4000]
    except OSError:
        return platform.machine() + platform.processor()


def _compile(source: Path, flags: list[str]) -> Path:
    """Compile `source` with these flags into the cache (reused while source, flags and CPU match)."""
    cc = os.environ.get("CC", "cc")
    code = source.read_bytes()
    key = hashlib.sha256(code + " ".join([cc, *flags, sys.platform, _this_cpu()]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{source.stem}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([cc, *flags, "-shared", "-fPIC", "-std=c99", str(source), "-o", str(built), "-lm"],
                           check=True, capture_output=True, timeout=120)
            os.replace(built, target)            # atomic: a parallel build never sees half a file
    return target


def build(source: Path, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why every flag set failed)."""
    errors = []
    for flags in FLAG_SETS:
        try:
            return ctypes.CDLL(str(_compile(source, [*flags, *extra_flags]))), ""
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            errors.append(f"{' '.join(flags)}: {e} {detail.decode(errors='replace')[-300:]}".strip())
    return None, "; ".join(errors)


class CKernel:
    """One C file and the functions Python calls in it, built and typed on the first `load()`.

    functions: C name -> (argument types, return type), e.g. {"f": ([PTR, INT], None)}: ctypes
    passes exactly these (a wrong count or type would be undefined behaviour in C).
    flags: extra compiler flags, preferred; a compiler that refuses them gets a build without.
    """

    def __init__(self, source: Path, functions: dict[str, tuple[list, type | None]], flags: tuple[str, ...] = ()):
        self.source, self.functions, self.flags = Path(source), functions, tuple(flags)
        self.load_error = ""            # why the last load failed ("" when it did not)
        self._lib, self._tried = None, False
        self.ops: dict[str, str] = {}   # torch op -> the C function its C++ wrapper calls (define_op)
        self.native = False             # True once loaded with every op of it dispatching to C++
        self._native: set[str] = set()

    def load(self) -> ctypes.CDLL | None:
        """The library, its functions typed (`lib.name(...)`), or None (the reason in `load_error`)."""
        if not self._tried:
            lib, self.load_error = build(self.source, self.flags)
            if lib is None and self.flags:
                lib, self.load_error = build(self.source)
            if lib is not None:
                for name, (argtypes, restype) in self.functions.items():
                    fn = getattr(lib, name)             # ctypes keeps this object: the types stay set
                    fn.argtypes, fn.restype = argtypes, restype
            self._lib, self._tried = lib, True
            for op in self.ops:
                self._enable(op)
        return self._lib

    def _enable(self, op: str) -> None:
        """Make op's C++ wrapper its CPU kernel, calling this library's C function (if both exist)."""
        if self._lib is not None and op not in self._native:
            if native_ops.enable(op, ctypes.cast(getattr(self._lib, self.ops[op]), ctypes.c_void_p).value):
                self._native.add(op)
        self.native = bool(self.ops) and self._native == set(self.ops)

    def function(self, name: str):
        """One typed C function of the library, or None if it could not be built."""
        lib = self.load()
        return None if lib is None else getattr(lib, name)

    def module_getattr(self, module: str):
        """A module's `__getattr__` (PEP 562): `module.load_error` reads this kernel's, current."""
        def __getattr__(name):
            if name == "load_error":
                return self.load_error
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return __getattr__


# torch.ops.minillm.*: every kernel's op lives in this one namespace.
_OPS = torch.library.Library("minillm", "FRAGMENT")


def define_op(schema: str, cpu_impl, fake_impl, kernel: CKernel | None = None, function: str = "") -> None:
    """Make `torch.ops.minillm.<name>` from a schema such as "name(Tensor x, int n) -> Tensor":
    `cpu_impl` runs it on CPU tensors in Python (ctypes); `fake_impl` returns an empty output of
    the right shape and dtype, all torch.compile needs to know of it. With `kernel` and its C
    `function`: once kernel.load() succeeds, torch_ops.cpp's wrapper of the op calls `function`
    and becomes the op's CPU kernel (native_ops.py), `cpu_impl` the fallback where it cannot.

    Why an op: torch.compile cannot trace a ctypes call (it would break its graph at every
    layer); an op with a fake implementation is one opaque node of the graph instead. Why
    torch.library.Library and not @torch.library.custom_op: the latter's dispatch costs
    ~40 us a call, ~10x more. Why `cpu_impl` is registered for CompositeExplicitAutograd and
    not CPU: a CPU kernel registered later (the C++ one) takes precedence over it, with no
    warning about an override and nothing unregistered while a call may be running.
    """
    name = schema.split("(", 1)[0]

    def python_impl(*args):
        if args[0].device.type != "cpu":                # CompositeExplicitAutograd: any device
            raise NotImplementedError(f"minillm::{name} runs on CPU tensors only, got {args[0].device}")
        return cpu_impl(*args)
    _OPS.define(schema)
    _OPS.impl(name, python_impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"minillm::{name}", fake_impl, lib=_OPS)
    if kernel is not None:
        kernel.ops[name] = function
        kernel._enable(name)                            # if it was loaded already
