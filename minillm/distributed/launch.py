"""`python -m minillm worker`: a headless node of a multi-node group (the same as `serve` with
--node-rank R > 0).

    node 0:  python -m minillm serve --model M --pipeline-parallel-size 2 --nnodes 2 --node-rank 0 \\
                 --dist-init-addr 10.0.0.1:29500
    node 1:  python -m minillm worker --pipeline-parallel-size 2 --nnodes 2 --node-rank 1 \\
                 --dist-init-addr 10.0.0.1:29500 [--node-addr 10.0.0.2]

Every node sets the same MINILLM_DIST_TOKEN. Node R starts its ranks (node.py) and waits for
the head: the weights come from node 0, so node R needs the package, not the model's files.
"""
from __future__ import annotations

import argparse

from .node import run_node
from .world import Layout


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--dist-init-addr", required=True, help="node 0's HOST:PORT (its rendezvous)")
    add_node_addr(p)


def add_node_addr(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-addr", default=None,
                   help="the address this node's ranks bind to (default: the one that reaches --dist-init-addr)")


def main(args) -> int:
    return headless(args.tensor_parallel_size or 1, args.pipeline_parallel_size or 1, args.nnodes,
                    args.node_rank, args.dist_init_addr, args.node_addr)


def headless(tp: int, pp: int, nnodes: int, node_rank: int, dist_init_addr: str | None, node_addr: str | None) -> int:
    if not dist_init_addr:
        raise ValueError("a headless node needs --dist-init-addr HOST:PORT (node 0's)")
    return run_node(Layout(tp, pp, nnodes), node_rank, dist_init_addr, node_addr)
