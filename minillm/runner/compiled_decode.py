"""`compile=True`: the static decode step (`static_decode.py`) through torch.compile.

Why: at batch 1 a decode step of the embedded model is bound by per-op overhead, not by
arithmetic: ~30 layers x ~15 ops, each a Python call and a kernel launch. torch.compile
traces the step once per bucket size (dynamic=False: every shape is a constant, so
inductor fuses RMSNorm, RoPE, SiLU and the K/V write into a few C++ loops per layer) and
replays the generated code. The C kernels are torch ops (`minillm::paged_decode_attention`
in cpu_paged.py, `minillm::panel_linear` in cpu_linear.py) so they sit in the graph without
a break; the smaller linears, and quantized ones (aten ops), go to inductor.

Compiled lazily, per bucket, on the first decode step of that size. The artifacts go to
`<minillm cache>/inductor` (TORCHINDUCTOR_CACHE_DIR, unless you set it), so the next
process reloads them instead of compiling again.

Measured (indicative only: 2 CPU cores shared with other jobs, load average 5-9; embedded
SmolLM2-135M, float32, context 128, 1 thread; best of 30 steps, variants taking turns;
`python -m minillm.bench.decode_step --compile --threads 1 --repeats 30`, with a fresh
TORCHINDUCTOR_CACHE_DIR for "cold", run again for "warm"):

    batch   eager ms   compiled ms   compile s cold / warm
      1       44.3        39.5           125 / 21
      8       77.9        69.9            95 / 12
     32      ~350        ~330            109 / 23      (noisy: the load peaked here)

So compile saves ~10 % per step at batch 1 and 8 and little at 32, where the matmuls
dominate. What did not help (same command, earlier, lighter load, 2 threads): the linears
left to inductor (F.linear -> MKL mm: 63 ms at batch 1 against 37 eager; 196 against 110
at batch 32), and freezing on top of that (170 ms at batch 1); the ops defined with
@torch.library.custom_op (~40 us of dispatch per call, 121 calls a step: 70 against 57).
Hence the C kernels as plain torch.library ops, and no freezing. A warm start still
traces with dynamo (seconds per bucket); only inductor's code generation is cached.

The graph's wrapper is C++ (inductor's `cpp_wrapper`): by default inductor writes the code that
calls the generated loops and the C kernels' ops in Python, ~360 calls a batch-1 step, and that
Python was 1.4 ms of a 7.9 ms w4a8 step; as C++ the step takes 7.4 ms (2-core Xeon, 100 steps,
`python -m minillm.bench.step_profile --quantization w4a8 --compile --max-num-seqs 1 --steps 100`,
run alternately). The price is a C++ compile of the wrapper on a cold start (cached like the rest).

Guards: before each call dynamo re-checks what the graph assumed, and for a model that is
every parameter and module attribute: 2.3 ms of a 15.5 ms batch-1 step (w4a8, 2 threads,
torch.profiler's "TorchDynamo Cache Lookup"), 0.2 ms with the module guards skipped
(`torch.compiler.skip_guard_on_all_nn_modules_unsafe`). Unsafe in general; safe here because
the engine owns its model (runner/engine_model.py: nobody else swaps its linears or converts
it) and never changes it after building the step. One thing remains: dynamo keeps compiled
graphs on the function's code object, shared by every engine in the process, and without the
module guards a graph built for another engine's model (say int8) would be found for this
one's (int4). So each engine compiles a copy of the step's function with a code object of
its own (`own_code_copy`), and its lookups see only its own graphs.
"""
from __future__ import annotations

import functools
import os
import types
import warnings

import torch

from ..utils.paths import cache_dir
from .fixed_shape_decode import StaticDecodeStep


def use_minillm_inductor_cache() -> None:
    """Keep compiled artifacts in the minillm cache (unless TORCHINDUCTOR_CACHE_DIR is set)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))


def own_code_copy(method):
    """`method` (bound) as a new function with a copy of its code object: same behaviour, a
    dynamo cache of its own (see the module docstring)."""
    f = method.__func__
    copy = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    return types.MethodType(copy, method.__self__)


class CompiledDecodeStep:
    """`run(seqs) -> logits [len(seqs), V]`: one compiled graph per bucket, built on first use.
    If compiling fails (no C++ compiler, an op inductor cannot handle), it warns once and
    runs the same static step eagerly: same tokens, no speed-up."""

    def __init__(self, step: StaticDecodeStep, freezing: bool = False, max_autotune: bool = False):
        use_minillm_inductor_cache()
        self.step = step
        self.options = {"freezing": freezing, "max_autotune": max_autotune, "cpp_wrapper": True,
                        "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        self.forward_copy = own_code_copy(step.forward)                    # this engine's graphs only
        self.compiled: dict[int, object] = {}
        self.warm: set[int] = set()          # buckets whose graph is built
        self.failed = False

    def callable_for(self, bucket: int):
        """The bucket's compiled forward; compiled on its first call (not here)."""
        if self.failed:
            return functools.partial(self.step.forward, bucket)
        if bucket not in self.compiled:
            fn = functools.partial(self.forward_copy, bucket)
            self.compiled[bucket] = torch.compile(fn, dynamic=False, fullgraph=True, options=self.options)
        return self.compiled[bucket]

    @torch.inference_mode()
    def forward(self, bucket: int) -> torch.Tensor:
        fn = self.callable_for(bucket)
        if self.failed or bucket in self.warm:
            return fn()
        # First call of this bucket compiles. All buckets share one code object
        # (StaticDecodeStep.forward), so allow a graph per bucket before dynamo gives up.
        try:
            with torch._dynamo.config.patch(recompile_limit=len(self.step.buckets) + 8):
                out = fn()
        except Exception as e:   # noqa: BLE001 - any compiler failure: keep serving, eagerly
            warnings.warn(f"torch.compile of the decode step failed, running it eagerly: {e!r:.300}")
            self.failed = True
            return self.step.forward(bucket)
        self.warm.add(bucket)
        return out

    def run(self, seqs) -> torch.Tensor:
        return self.forward(self.step.prepare(seqs))[:len(seqs)]


def compile_decode_step(step: StaticDecodeStep, freezing: bool = False, max_autotune: bool = False):
    """A function seqs -> logits running `step` compiled (see CompiledDecodeStep)."""
    return CompiledDecodeStep(step, freezing, max_autotune).run
