"""Tensor parallelism measured: per size, a decode step's time split into compute and
communication (time inside collectives, as rank 0 sees it), and the bytes the collectives moved
per step beside the formula; then what carrying a step's plan to the ranks costs, down a pipe
(what the executor does) against a broadcast over the gloo group.

    python -m minillm bench tp [--model M | --model-shape S | --hf-config F] [--sizes 1 3] [--batch 8] [--max-tokens 32] [--json FILE] [--quick]

The formula, per decode step of B sequences (one token each) on N ranks, counting what each rank
hands its collectives: per layer two all-reduces of B x hidden values (after o_proj and after
down_proj), one for the embedding, and the head's all-gather of B x vocab/N values. On one CPU the
ranks share the cores, so TP is slower than one process here: the point is the split, and where
the time goes. On GPUs (NCCL) each rank has its own device and the same bytes move over NVLink.
"""
from __future__ import annotations

import json
import pickle
import time

import torch

from ..engine.engine import LLMEngine
from ..models import load_model
from ..sampling_params import SamplingParams
from .model_args import add_model_arguments, is_dummy_run, label, load, print_header, resolve_model_args

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def formula_bytes(cfg, batch: int, n: int, itemsize: int) -> int:
    """Bytes one rank hands its collectives in one decode step of `batch` tokens (module doc)."""
    reduces = (2 * cfg.num_hidden_layers + 1) * batch * cfg.hidden_size * itemsize
    gathers = batch * -(-cfg.vocab_size // n) * itemsize     # the head's slice of the logits, in the model's dtype
    return reduces + gathers


def measure_size(model, tokenizer, n: int, batch: int, max_tokens: int) -> dict:
    engine = LLMEngine(model, tokenizer, tensor_parallel_size=n, num_kv_blocks=max(64, batch * 8),
                       enable_prefix_caching=False)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"{PROMPT} ({i})"}], True)
                   for i in range(batch)]
        engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0))        # warm up
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        while any(not r.seqs[0].output_token_ids for r in engine.requests.values()):       # prefill done
            engine.step()
        before = engine.runner.counters()[0] if n > 1 else None
        steps, start = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        seconds = (time.perf_counter() - start) / steps
        row = {"tensor_parallel_size": n, "batch": batch, "step_ms": 1000 * seconds, "steps": steps}
        if n > 1:
            after = engine.runner.counters()[0]
            comm = (after["comm_seconds"] - before["comm_seconds"]) / steps
            row.update(comm_ms=1000 * comm, compute_and_rest_ms=1000 * (seconds - comm),
                       comm_bytes_per_step=(after["comm_bytes"] - before["comm_bytes"]) / steps,
                       formula_bytes_per_step=formula_bytes(model.config, batch, n, model.dtype.itemsize),
                       collectives_per_step=(after["comm_calls"] - before["comm_calls"]) / steps)
        return row
    finally:
        close = getattr(engine.runner, "close", None)
        if close is not None:
            close()


def _peer(port: int, conn, rounds: int) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    for _ in range(rounds):                              # the pipe: receive, acknowledge
        conn.recv_bytes()
        conn.send_bytes(b"k")
    for _ in range(rounds):                              # the group: receive the object, then a barrier
        box = [None]
        dist.broadcast_object_list(box, src=0)
        dist.barrier()
    dist.destroy_process_group()


def plan_transport(plan_bytes: bytes, rounds: int) -> dict:
    """Microseconds per plan, pipe vs gloo broadcast_object_list, each with an acknowledgement."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from ..utils.ports import free_port
    ctx, port = mp.get_context("spawn"), free_port()
    ours, theirs = ctx.Pipe()
    peer = ctx.Process(target=_peer, args=(port, theirs, rounds), daemon=True)
    peer.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    try:
        start = time.perf_counter()
        for _ in range(rounds):
            ours.send_bytes(plan_bytes)
            ours.recv_bytes()
        pipe = (time.perf_counter() - start) / rounds
        plan = pickle.loads(plan_bytes)
        start = time.perf_counter()
        for _ in range(rounds):
            dist.broadcast_object_list([plan], src=0)
            dist.barrier()
        group = (time.perf_counter() - start) / rounds
    finally:
        dist.destroy_process_group()
        peer.join(10)
    return {"plan_bytes": len(plan_bytes), "pipe_us": 1e6 * pipe, "gloo_broadcast_us": 1e6 * group}


def example_plan(tokenizer, batch: int) -> bytes:
    """A decode step's plan for `batch` running chat sequences, as the executor pickles it."""
    model, _ = load_model("tiny-llama", device="cpu")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=batch * 16)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"{PROMPT} ({i})"}], True)
               for i in range(batch)]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=8, temperature=0))
    engine.step()                                        # the prefill; the next plan is a decode step
    plan = engine.scheduler.plan_step()
    return pickle.dumps(("execute", plan.scheduled))


def run(args) -> dict:
    torch.set_grad_enabled(False)
    resolve_model_args(args)
    print_header(args)
    model, tokenizer = load(args, device="cuda" if torch.cuda.is_available() else "cpu")
    sizes = args.sizes or [1] + [d for d in range(2, model.config.num_key_value_heads + 1)
                                 if model.config.num_key_value_heads % d == 0 and model.config.intermediate_size % d == 0]
    max_tokens = 8 if args.quick else args.max_tokens
    rows = [measure_size(model, tokenizer, n, args.batch, max_tokens) for n in sizes]
    base = rows[0]["step_ms"]
    for row in rows:
        row["step_vs_one_rank"] = row["step_ms"] / base
        print("  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    transport = plan_transport(example_plan(tokenizer, args.batch), 20 if args.quick else 200)
    print(f"plan of a {args.batch}-sequence decode step ({transport['plan_bytes']} bytes): pipe "
          f"{transport['pipe_us']:.0f} us, gloo broadcast_object_list {transport['gloo_broadcast_us']:.0f} us")
    where = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
             else f"CPU, {torch.get_num_threads()} threads")
    report = {"sizes": rows, "plan_transport": transport, "machine": where, "model": label(args),
              "dummy_weights": is_dummy_run(args)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def main(args) -> dict:
    return run(args)


def add_arguments(p) -> None:
    add_model_arguments(p, help="default: the embedded SmolLM2 (TP sizes 1 and 3)")
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="default: 1 and every size that divides the KV heads")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
