#!/usr/bin/env python3
"""The one-shot GPU check: every GPU claim of the course, measured in one command.

    python scripts/gpu_check.py [--json gpu_check.json] [--quick] [--budget-s 470] [--only NAME ...]
    scripts/gpu_check.sh                  (the same, with the checkout's .venv when there is one)

On a CUDA machine with no network, in under 8 minutes: the GPU-marked tests, greedy
exactness against transformers on the GPU in float32 and bfloat16, `bench throughput`
against transformers (static batching and its continuous batching) with the embedded
model and a random model of Qwen3-0.6B's shape, `bench roofline`, and lessons 00-06 on
the GPU (nbval). Each stage runs in its own process with its own timeout (its process
group is killed when it runs over): a stage that fails or hangs is recorded and the next
one runs. The JSON (rewritten after every stage, so a killed run keeps what it did)
holds each stage's outcome, the tail of its output and the figures it wrote.
Without CUDA it says so and exits 2.

A repository tool, not part of the package: it runs the checkout's `tests/` and `solutions/`.
Every stage runs from the checkout's root, so the `minillm` it measures is the checkout's
(`python -m ...` puts the root first on sys.path; `gpu_check_stages.py` puts it there itself).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
LESSONS = [f"{n:02d}_" for n in range(7)]          # 00-06; 07 starts servers: the tests cover it
DEFAULT_BUDGET_S = 470                             # all stages together, under the 8 minutes promised


@dataclass
class Stage:
    name: str
    argv: list[str]
    timeout_s: float
    figures_path: str | None = None    # a JSON the stage writes; merged into the report


def run_stage(stage: Stage, timeout_s: float | None = None, env: dict | None = None) -> dict:
    """Run one stage in its own process group; never raises. `ok` only on exit status 0."""
    timeout_s = stage.timeout_s if timeout_s is None else timeout_s
    start = time.perf_counter()
    result = {"name": stage.name, "command": " ".join(stage.argv), "timeout_s": round(timeout_s, 1)}
    try:
        proc = subprocess.Popen(stage.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=REPO, env=env, start_new_session=True)
    except OSError as e:
        return {**result, "ok": False, "returncode": None, "timed_out": False, "seconds": 0.0,
                "output_tail": f"could not start: {e}"}
    try:
        output, timed_out = proc.communicate(timeout=timeout_s)[0], False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)          # the stage and whatever it started (workers, kernels)
        output, timed_out = proc.communicate()[0], True
    result.update(ok=proc.returncode == 0 and not timed_out, returncode=proc.returncode, timed_out=timed_out,
                  seconds=round(time.perf_counter() - start, 1), output_tail=(output or "")[-4000:])
    if stage.figures_path and Path(stage.figures_path).exists():
        try:
            result["figures"] = json.loads(Path(stage.figures_path).read_text())
        except ValueError as e:
            result["figures_error"] = f"unreadable figures: {e}"
    return result


def run_stages(stages: list[Stage], budget_s: float, report: dict, json_path: str | None = None) -> dict:
    """Run every stage in turn within `budget_s` seconds in all; a stage gets its own timeout
    or what is left of the budget, whichever is less, and is skipped when nothing is left."""
    start = time.perf_counter()
    report.setdefault("stages", [])
    for stage in stages:
        left = budget_s - (time.perf_counter() - start)
        if left < 5:
            result = {"name": stage.name, "ok": False, "skipped": "out of time", "seconds": 0.0}
        else:
            print(f"[gpu_check] {stage.name} (up to {min(stage.timeout_s, left):.0f} s) ...", flush=True)
            result = run_stage(stage, min(stage.timeout_s, left))
        verdict = "ok" if result["ok"] else ("skipped" if "skipped" in result else
                                               "TIMED OUT" if result.get("timed_out") else "FAILED")
        print(f"[gpu_check] {stage.name}: {verdict} in {result['seconds']} s", flush=True)
        if not result["ok"] and result.get("output_tail"):
            print(result["output_tail"][-1500:], flush=True)
        report["stages"].append(result)
        report["ok"] = all(s["ok"] for s in report["stages"])
        report["seconds"] = round(time.perf_counter() - start, 1)
        if json_path:
            Path(json_path).write_text(json.dumps(report, indent=2))
    return report


def default_stages(workdir: Path, quick: bool = False) -> list[Stage]:
    """The check's stages, cheapest and most telling first; figures land in `workdir`."""
    py = sys.executable
    figures = {name: str(workdir / f"{name}.json") for name in
               ("greedy-exactness", "throughput-smollm2", "throughput-qwen3-0.6b-shape", "roofline")}

    def in_process(name: str) -> list[str]:
        return [py, str(SCRIPTS / "gpu_check_stages.py"), name, "--json", figures[name]] + (["--quick"] * quick)

    lessons = sorted(str(p.relative_to(REPO)) for p in (REPO / "solutions").glob("0[0-6]_*.ipynb"))
    workers = ["-n", "4", "--dist", "loadfile"] if _has_xdist() else []
    roofline = [py, "-m", "minillm", "bench", "roofline", "--json", figures["roofline"],
                "--plot", str(workdir / "roofline.png")] + (["--quick"] * quick)
    return [
        Stage("gpu-tests", [py, "-m", "pytest", "-q", "-m", "gpu", "tests"], 100),
        Stage("greedy-exactness", in_process("greedy-exactness"), 75, figures["greedy-exactness"]),
        Stage("roofline", roofline, 50, figures["roofline"]),
        Stage("throughput-smollm2", in_process("throughput-smollm2"), 80, figures["throughput-smollm2"]),
        Stage("throughput-qwen3-0.6b-shape", in_process("throughput-qwen3-0.6b-shape"), 90,
              figures["throughput-qwen3-0.6b-shape"]),
        Stage("lessons", [py, "-m", "pytest", "-q", *workers, *lessons], 160),
        tensor_parallel_stage(py, workdir, quick),
    ]


def tensor_parallel_stage(py: str, workdir: Path, quick: bool) -> Stage:
    """`bench tp` over NCCL where the machine has 2 GPUs or more (SmolLM2 at TP=3 with 3, the tiny
    model at TP=2 with 2); a stage that only says so on one GPU."""
    import torch
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return Stage("tensor-parallel", [py, "-c", f"print('skipped: {gpus} GPU')"], 10)
    model, size = ("SmolLM2-135M-Instruct", 3) if gpus >= 3 else ("tiny-llama", 2)
    figures = str(workdir / "tensor-parallel.json")
    return Stage("tensor-parallel", [py, "-m", "minillm", "bench", "tp", "--model", model, "--sizes", "1", str(size),
                                     "--json", figures] + (["--quick"] * quick), 90, figures)


def _has_xdist() -> bool:
    return importlib.util.find_spec("xdist") is not None


def machine() -> dict:
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2 ** 30, 1),
                    bf16=torch.cuda.is_bf16_supported(including_emulation=False))
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="gpu_check.json", help="the report (default: gpu_check.json)")
    p.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="all stages together")
    p.add_argument("--only", nargs="+", default=None, help="run only these stages")
    args = p.parse_args(argv)
    info = machine()
    if not info["cuda_available"]:
        print(f"gpu_check: no CUDA device here (torch {info['torch']}, built for CUDA {info['cuda']}); "
              "run it on a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        return 2
    workdir = Path(args.json).resolve().parent / (Path(args.json).stem + "_files")
    workdir.mkdir(parents=True, exist_ok=True)
    stages = default_stages(workdir, args.quick)
    if args.only:
        unknown = set(args.only) - {s.name for s in stages}
        if unknown:
            p.error(f"unknown stage(s) {', '.join(sorted(unknown))}; stages: {', '.join(s.name for s in stages)}")
        stages = [s for s in stages if s.name in args.only]
    print(f"[gpu_check] {info}", flush=True)
    report = run_stages(stages, args.budget_s, {"machine": info, "quick": args.quick}, args.json)
    print(f"[gpu_check] {'all stages passed' if report['ok'] else 'some stages FAILED'} in {report['seconds']} s; "
          f"report: {args.json}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
