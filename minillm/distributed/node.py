"""A node's ranks: started with `python -m`, watched, and stopped together.

Node 0's ranks are started by the driver (pipeline_executor.py); node R > 0 runs
`python -m minillm worker --nnodes N --node-rank R --dist-init-addr HOST:PORT ...` (or `serve`
with --node-rank R), which is `run_node` here: start this node's ranks, then watch them. The
node stops all of them and exits non-zero when one exits, when the driver says the group failed
(the store's abort key), or when the driver is gone (the store is unreachable): nothing is left
running on a node whose group is over. Each rank also dies with this process (PR_SET_PDEATHSIG),
so killing a node's launcher (or its whole tree) leaves no rank behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .world import TOKEN_ENV, Layout, join_store, own_address, split_addr

WATCH_S = 0.5
ABORT_KEY = "minillm/abort"


def start_ranks(layout: Layout, node: int, master: str, bind: str, token: str) -> list[subprocess.Popen]:
    """This node's ranks, each `python -m minillm.distributed.stage_worker` (no multiprocessing)."""
    env = dict(os.environ, **{TOKEN_ENV: token})
    procs = []
    for rank in layout.ranks_on(node):
        argv = [sys.executable, "-m", "minillm.distributed.stage_worker", "--rank", str(rank), "--tp", str(layout.tp),
                "--pp", str(layout.pp), "--nnodes", str(layout.nnodes), "--master", master, "--bind", bind,
                "--node", str(node)]
        procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL))
    return procs


def stop_ranks(procs: list[subprocess.Popen], grace: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def run_node(layout: Layout, node: int, dist_init_addr: str, bind: str | None = None) -> int:
    """Node R > 0 (module doc): returns the exit code once its ranks are over."""
    if not 0 < node < layout.nnodes:
        raise ValueError(f"node_rank must be in 1..{layout.nnodes - 1} for a headless node, got {node}")
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise ValueError(f"set {TOKEN_ENV} to the same secret on every node (the head's too)")
    host, port = split_addr(dist_init_addr)
    bind = bind or own_address(host, port)
    print(f"minillm node {node}: ranks {layout.ranks_on(node)} binding {bind}, joining {dist_init_addr}", flush=True)
    procs = start_ranks(layout, node, dist_init_addr, bind, token)
    signal.signal(signal.SIGTERM, lambda *_: (stop_ranks(procs), os._exit(0)))
    try:
        return watch(procs, host, port, node)
    except KeyboardInterrupt:
        return 0
    finally:
        stop_ranks(procs)


def watch(procs, host: str, port: int, node: int) -> int:
    store = None
    while True:
        time.sleep(WATCH_S)
        for p in procs:
            if p.poll() is not None:
                print(f"minillm node {node}: a rank exited (code {p.returncode}); stopping the others", flush=True)
                return p.returncode or 1
        try:
            store = store or join_store(host, port, 30.0)
            if store.check([ABORT_KEY]):
                print(f"minillm node {node}: the group failed: {store.get(ABORT_KEY).decode()}", flush=True)
                return 1
        except Exception as e:
            if store is not None:                    # connected before: the driver is gone
                print(f"minillm node {node}: the driver is gone ({e!r}); stopping", flush=True)
                return 1
