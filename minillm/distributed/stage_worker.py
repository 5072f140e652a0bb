"""One pipeline rank's process: `python -m minillm.distributed.stage_worker --rank R ...`.

Started with `python -m` by the driver (node 0's ranks) or by a node's launcher (node.py), or
by torchrun, never by multiprocessing: nothing of the user's script is imported here, so a
script without an `if __name__ == "__main__":` guard works. It joins the group (world.py: the
token handshake, then the groups), receives its setup and its stage's weights from the driver
(plain data and raw tensors, no pickle), builds its Stage, and runs what the driver broadcasts:
    step        its part of the forward (stage.py), micro-batch after micro-batch: while the
                next stage works on micro-batch k this one already computes k + 1
    trace       record (or stop recording) the order micro-batches enter and leave the stages
    block_ops   the same swaps and copies on its own layers' pool
    noop        the driver's keep-alive while the engine idles
    counters    its step, busy and transfer times and its trace back to the driver (bench pp)
    stop        exit
It beats a heartbeat into the store every HEARTBEAT_S, so the driver can name a node that went
silent; it exits when the driver is gone (no keep-alive for IDLE_TIMEOUT_S, or the store is
unreachable), and dies with the process that started it (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import torch

from ..kv.block_manager import BlockOps
from . import wire
from .stage import DTYPES, Stage
from .worker import die_with_parent
from .world import TOKEN_ENV, Group, Layout, broadcast_bytes, join_store, prove, recv_bytes, send_bytes, split_addr

START_TIMEOUT_S = 300.0       # joining: the driver may still be loading the model
OP_TIMEOUT_S = 60.0           # any one transfer or collective
IDLE_TIMEOUT_S = 20.0         # no plan nor keep-alive (every KEEPALIVE_S) for this long: the driver is gone
HEARTBEAT_S = 0.5


def heartbeat(host: str, port: int, rank: int) -> None:
    store = join_store(host, port, 10.0)
    while True:
        try:
            store.add(f"minillm/beat/{rank}", 1)
        except Exception:                   # the store (the driver's process) is gone
            print(f"minillm rank {rank}: the driver is gone, exiting", file=sys.stderr, flush=True)
            os._exit(1)
        time.sleep(HEARTBEAT_S)


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m minillm.distributed.stage_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--master", required=True, help="the driver's HOST:PORT")
    p.add_argument("--bind", required=True, help="this node's address: the ranks listen only there")
    p.add_argument("--node", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the launcher's to handle; it stops us
    layout, rank = Layout(args.tp, args.pp, args.nnodes), args.rank
    host, port = split_addr(args.master)
    store = join_store(host, port, START_TIMEOUT_S)
    where = f"rank {rank} (stage {layout.stage_of(rank)}, node {args.node} at {args.bind})"
    try:
        prove(store, rank, os.environ.get(TOKEN_ENV, ""))
        store.set(f"minillm/where/{rank}", where)
        threading.Thread(target=heartbeat, args=(host, port, rank), daemon=True).start()
        run(store, layout, rank, args.bind)
    except Exception as e:
        try:
            store.set(f"minillm/error/{rank}", f"{where} failed: {e!r}"[:500])
        finally:
            print(f"minillm {where} failed: {e!r}", file=sys.stderr, flush=True)
        return 1
    return 0


def run(store, layout: Layout, rank: int, bind: str) -> None:
    cpu = torch.device("cpu")
    control = Group(store, "control", rank, layout.world_size, bind, cpu, OP_TIMEOUT_S)
    kind, setup = wire.decode(recv_bytes(control, 0, START_TIMEOUT_S))
    if kind != "setup":
        raise wire.WireError(f"expected the setup message first, got {kind!r}")
    tensors = {}
    for name, shape, dtype in setup["tensors"]:
        tensors[name] = control.recv(torch.empty(shape, dtype=DTYPES[dtype]), 0, START_TIMEOUT_S)
    torch.set_num_threads(setup["threads"])
    s, t = layout.stage_of(rank), layout.tp_rank_of(rank)
    device = cpu if setup["device"] == "cpu" else torch.device("cuda", (rank - 1) % layout.per_node)
    tp = Group(store, f"tp{s}", t, layout.tp, bind, device, OP_TIMEOUT_S) if layout.tp > 1 else None
    prev = Group(store, f"pair{s - 1}.{t}", 1, 2, bind, device, OP_TIMEOUT_S) if s > 0 else None
    nxt = Group(store, f"pair{s}.{t}", 0, 2, bind, device, OP_TIMEOUT_S) if s < layout.pp - 1 else None
    stage = Stage(setup, tensors, tp, device)
    del tensors
    control.send(torch.ones(1), 0)                          # ready
    pipe, trace = Pipe(prev, nxt), Trace(store)
    compute = busy = 0.0
    steps = micro = 0
    while True:
        kind, msg = wire.decode(broadcast_bytes(control, None, IDLE_TIMEOUT_S))
        if kind == "stop":
            return
        if kind == "block_ops":
            stage.kv_cache.apply(BlockOps(*(list(map(tuple, msg[k])) for k in ("swap_out", "swap_in", "copies"))))
        elif kind == "step":
            start, waited, at = time.perf_counter(), pipe.waited, 0
            for k, size in enumerate(msg["micro"]):           # in order: stage s runs k while s + 1 runs k - 1
                def receive(x, k=k):
                    pipe.recv(x)
                    trace.mark(steps, k, "in")          # its input is here: the stage starts on it
                    return x

                def send(x, k=k):
                    trace.mark(steps, k, "out")         # before the send is posted: the next stage's "in" comes after
                    pipe.send(x)
                if prev is None:
                    trace.mark(steps, k, "in")
                logits = stage.run(msg["seqs"][at:at + size], receive, send)
                if nxt is None:
                    trace.mark(steps, k, "out")
                at += size
                if logits is not None and t == 0:
                    logits = logits.float().cpu()
                    sent = time.perf_counter()
                    control.send(logits, 0)
                    waited -= time.perf_counter() - sent        # waiting for the driver is idle too
            pipe.flush()
            elapsed = time.perf_counter() - start
            compute, busy = compute + elapsed, busy + elapsed - (pipe.waited - waited)
            steps, micro = steps + 1, micro + len(msg["micro"])
        elif kind == "trace":
            trace.on = msg["on"]
        elif kind == "counters":
            groups = [g for g in (tp, prev, nxt) if g is not None]
            transfer = {g.name: g.seconds for g in groups}
            send_bytes(control, wire.encode("report", rank=rank, stage=s, steps=steps, micro_batches=micro,
                                            step_seconds=compute, busy_seconds=busy, transfer_seconds=transfer,
                                            events=trace.take()), 0)


class Pipe:
    """This rank's ends of the stage-to-stage links. A receive blocks (the previous stage must
    have finished that micro-batch); a send is only posted, so the stage starts its next
    micro-batch at once (the overlap), and is waited for before the next send and at the step's
    end. `waited`: seconds spent blocked in either, idle time rather than work (bench pp)."""

    def __init__(self, prev, nxt):
        self.prev, self.nxt, self.pending, self.waited = prev, nxt, None, 0.0

    def recv(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        self.prev.recv(x, 0)
        self.waited += time.perf_counter() - start
        return x

    def send(self, x: torch.Tensor) -> None:
        self.flush()
        x = x.contiguous()
        self.pending = (self.nxt.pg.send([x], 1, 0), x)      # the tensor stays alive until it is sent

    def flush(self) -> None:
        if self.pending is not None:
            (work, x), self.pending = self.pending, None
            start = time.perf_counter()
            self.nxt._run(work, x, start)                       # bounded wait, counted as the group's seconds
            self.waited += time.perf_counter() - start


class Trace:
    """Off unless the driver asks (bench, tests): which micro-batch entered ("in") and left
    ("out") this stage, in ONE order over all ranks: each event takes a ticket from the store's
    counter, so "stage 0 took micro-batch k+1 in before stage 1 let k out" is an ordering fact
    across processes (and machines), not a comparison of clocks."""

    def __init__(self, store):
        self.store, self.on, self.events = store, False, []

    def mark(self, step: int, k: int, what: str) -> None:
        if self.on:
            self.events.append([self.store.add("minillm/trace", 1), step, k, what])

    def take(self) -> list:
        events, self.events = self.events, []
        return events

if __name__ == "__main__":
    sys.exit(main())
