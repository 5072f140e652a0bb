"""Where a decode step's time goes, operator by operator (torch.profiler).

    python -m minillm.bench.step_profile [--model M | --model-shape S] [--batch 1] [--context 128] [--steps 30]
                                         [--top 12] [engine flags: --quantization w4a8, --compile ...]

`bench quant` says how fast a configuration decodes, `bench overhead` how much of a step is the
engine's own Python, `op_count` how many operations a step asks for. This says which operators
the time goes to: `batch` requests of `context` prompt tokens are prefilled and decoded a few
steps (overhead.start_decoding; with `--compile`, the bucket's graph is built then), then `--steps` decode steps are
timed without the profiler and profiled with it. Per operator: its own CPU time (children not
included) and calls, both per step; the C kernels appear as `minillm::<op>`, a compiled graph's
generated loops as the graph's own time. The profiler adds its own cost to every op it records
(a few us), so the table's total runs above the unprofiled step time printed beside it.
"""
from __future__ import annotations

import argparse
import time

import torch

from ..cli.engine_args import add_engine_arguments
from .model_args import add_model_arguments, is_dummy_run, label, resolve_model_args
from .overhead import build_engine, start_decoding


def profile_decode(engine, batch: int, context: int, steps: int) -> dict:
    """{"step_ms": unprofiled decode step, "ops": [(name, self ms per step, calls per step)], slowest first}."""
    ids = start_decoding(engine, batch, context, 2 * steps)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_ms = 1e3 * (time.perf_counter() - start) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    for request_id in ids:
        engine.abort_request(request_id)
    ops = [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count / steps) for e in prof.key_averages()]
    ops.sort(key=lambda op: op[1], reverse=True)
    return {"step_ms": step_ms, "ops": ops}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser, help="default: the embedded SmolLM2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed, then as many profiled")
    parser.add_argument("--top", type=int, default=12, help="how many operators to list")
    parser.add_argument("--threads", type=int, default=None)
    add_engine_arguments(parser, dtype="float32")
    args = resolve_model_args(parser.parse_args(argv))
    engine = build_engine(argparse.Namespace(**{**vars(args), "steps": 2 * args.steps}), [args.batch])
    result = profile_decode(engine, args.batch, args.context, args.steps)
    total = sum(ms for _, ms, _ in result["ops"])
    print(f"decode step, batch {args.batch}, context {args.context}"
          + (f", {label(args)}" if is_dummy_run(args) else "") + f": {result['step_ms']:.2f} ms unprofiled; "
          f"profiled, per step ({total:.2f} ms in all):")
    print(f"  {'operator':<44}{'self ms':>9}{'share':>8}{'calls':>8}")
    for name, ms, calls in result["ops"][:args.top]:
        print(f"  {name[:43]:<44}{ms:>9.3f}{ms / total:>8.1%}{calls:>8.1f}")
    engine.shutdown()
    return result


if __name__ == "__main__":
    main()
