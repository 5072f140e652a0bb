"""The engine's own overhead: per decode step, the time outside the model's forward.

    python -m minillm bench overhead [--batch 1 8 64] [--context 128] [--steps 32] [--profile N]
                                     [--json FILE] [engine flags]

For each batch size B, B requests of `context` prompt tokens decode greedily together; after
their prefill and a few warm-up steps, `steps` pure decode steps are timed. Each step is split:

    forward           the model's call and its logits (the runner's `model(...)` and
                      `compute_logits`; with the static decode step on, its `run_decode`,
                      whose own input building then counts here)
    schedule          the scheduler's plan (who runs, block tables grown)
    prepare_inputs    the runner's input building: ids, positions, slot mapping, PagedStep
    sample            the rows' logits processing and the sampler (engine/sampling_stage.py)
    process_outputs   appending tokens, stop checks, detokenizing, building the outputs
    other             the rest of `engine.step()` (bookkeeping, block moves)

so that forward + the five others = the step, reported as the mean per step, with the
overhead (the step less its forward) and its fraction of the step. The split is taken by
wrapping those calls on this engine's objects with perf_counter (for the measurement only:
they are put back after), and `--profile N` adds cProfile's top N functions by own time over
as many steps again, outside the forward (the profiler is paused inside it). The engine flags are
cli/engine_args.py's (CPU, float32 by default; `--quantization w4a8`, `--compile`, ...). The
wrappers add about a microsecond a call. On a shared machine the figures are rough: run it quiet.
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import time

import torch

from ..cli.engine_args import add_engine_arguments, engine_config_from_args
from ..sampling_params import SamplingParams
from ..utils import cdiv
from .model_args import add_model_arguments

PHASES = ("schedule", "prepare_inputs", "sample", "process_outputs", "other")
WARMUP_STEPS = 3


class StepTimer:
    """Wraps an engine's calls so that each step's time is split into the forward and PHASES;
    `with StepTimer(engine) as timer:` puts the engine's own calls back on leaving."""

    def __init__(self, engine, profiler: cProfile.Profile | None = None):
        self.engine, self.spent, self.steps = engine, {}, []
        self.profiler, self._depth, self._timing, self._wrapped = profiler, 0, False, []
        runner, model = engine.runner, engine.runner.model
        self._wrap(engine.scheduler, "plan_step", "schedule")
        self._wrap(runner, "execute", "execute")
        if runner.run_decode is not None:            # the static decode step (--compile): its whole call
            self._wrap(runner, "run_decode", "forward")  # (the model's own forward is left alone: compiled)
        else:
            self._wrap(model, "forward", "forward")      # nn.Module.__call__ finds the instance's own
            self._wrap(model, "compute_logits", "forward")
        self._wrap(engine, "_sample", "sample")
        self._wrap(engine, "_emit", "process_outputs")
        self._wrap(engine, "_collect_outputs", "process_outputs")

    def __enter__(self) -> "StepTimer":
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, own in reversed(self._wrapped):
            if own is None:
                delattr(owner, name)                    # the class's method again
            else:
                setattr(owner, name, own)

    def _wrap(self, owner, name: str, phase: str) -> None:
        fn = getattr(owner, name)
        self._wrapped.append((owner, name, vars(owner).get(name)))

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            outside = phase == "forward" and self._timing and self.profiler is not None and not self._depth
            self._depth += phase == "forward"
            if outside:
                self.profiler.disable()          # the profile is the engine's own time only
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - start
                self._depth -= phase == "forward"
                if outside:
                    self.profiler.enable()
        setattr(owner, name, timed)

    def step(self) -> list:
        """One engine step, timed; its split is appended to `steps` (milliseconds)."""
        self.spent, self._timing = {}, True
        if self.profiler is not None:
            self.profiler.enable()
        start = time.perf_counter()
        try:
            outputs = self.engine.step()
        finally:
            total = time.perf_counter() - start
            if self.profiler is not None:
                self.profiler.disable()
            self._timing = False
        s = self.spent
        forward = s.get("forward", 0.0)
        row = {"step": total, "forward": forward, "schedule": s.get("schedule", 0.0),
               "prepare_inputs": s.get("execute", 0.0) - forward,
               "sample": s.get("sample", 0.0),
               "process_outputs": s.get("process_outputs", 0.0)}
        row["other"] = total - sum(row[k] for k in ("forward", *PHASES[:-1]))
        self.steps.append({k: 1000 * v for k, v in row.items()})
        return outputs


def summarize(steps: list[dict]) -> dict:
    """Mean per step of each part (ms), the overhead (step - forward) and its fraction."""
    n = len(steps)
    out = {k: sum(s[k] for s in steps) / n for k in ("step", "forward", *PHASES)}
    out["overhead"] = out["step"] - out["forward"]
    out["overhead_fraction"] = out["overhead"] / out["step"] if out["step"] else 0.0
    out["steps"] = n
    return out


def start_decoding(engine, batch: int, context: int, steps: int) -> list[str]:
    """`batch` requests of `context` distinct prompt tokens, prefilled and WARMUP_STEPS decode steps
    in, with `steps` more decode steps left (and two to spare). Returns their request ids."""
    params = SamplingParams(temperature=0, max_tokens=steps + WARMUP_STEPS + 2, ignore_eos=True)
    vocab = engine.resolved.vocab_size
    ids = [f"decode-{batch}-{i}-{time.monotonic_ns()}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        prompt = [(1000 + 7 * i + 13 * j) % vocab for j in range(context)]    # distinct: no prefix sharing
        engine.add_request(request_id, prompt, params)
    while not all(len(s) > context for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()                                   # the prefills (chunked when the budget says so)
    for _ in range(WARMUP_STEPS):
        engine.step()
    return ids


def measure(engine, batch: int, context: int, steps: int, profile: int = 0) -> dict:
    """Decode `batch` requests together; the split of `steps` pure decode steps and, when
    `profile`, cProfile's top functions over as many steps again (apart: the profiler's own
    cost would swell the split)."""
    start_decoding(engine, batch, context, (2 if profile else 1) * steps)
    with StepTimer(engine) as timer:
        for _ in range(steps):
            timer.step()
    result = summarize(timer.steps)
    if profile:
        with StepTimer(engine, cProfile.Profile()) as profiled:
            for _ in range(steps):
                profiled.step()
        text = io.StringIO()
        pstats.Stats(profiled.profiler, stream=text).sort_stats("tottime").print_stats(profile)
        result["profile"] = text.getvalue()
    while engine.has_unfinished_requests():
        engine.step()
    return result


def build_engine(args, batches: list[int]):
    from ..engine.engine import LLMEngine
    from .model_args import load, print_header, resolve_model_args
    resolve_model_args(args)
    config = engine_config_from_args(args)               # a bad flag fails here, before loading
    if args.threads:
        torch.set_num_threads(args.threads)
    print_header(args)
    model, tokenizer = load(args, device=config.device, dtype=config.dtype)
    blocks = max(batches) * (cdiv(args.context + args.steps + WARMUP_STEPS + 8, config.block_size) + 1) + 1
    return LLMEngine(model, tokenizer, engine_config_from_args(
        args, num_kv_blocks=config.num_kv_blocks or blocks,
        max_num_seqs=max(*batches, config.max_num_seqs)))


def main(args) -> dict:
    engine = build_engine(args, args.batch)
    report = {}
    print(f"{'batch':>5} {'step ms':>9} {'forward':>9} {'else':>8} {'else %':>7} | "
          + " ".join(f"{p:>15}" for p in PHASES))
    for b in args.batch:
        r = measure(engine, b, args.context, args.steps, args.profile)
        report[str(b)] = r
        print(f"{b:>5} {r['step']:>9.2f} {r['forward']:>9.2f} {r['overhead']:>8.2f} "
              f"{r['overhead_fraction']:>7.1%} | " + " ".join(f"{r[p]:>15.3f}" for p in PHASES), flush=True)
    for b, r in report.items():
        if "profile" in r:
            print(f"\n-- batch {b}: cProfile outside the forward, top {args.profile} by own time, "
                  f"{r['steps']} steps --")
            print(r["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, help="default: the embedded SmolLM2")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--context", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per batch size")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N functions")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    add_engine_arguments(p, device="cpu", dtype="float32")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    main(parser.parse_args())
