"""`python -m minillm worker`: a headless node of a multi-node group (the same as `serve` with
--node-rank R > 0), and the group read from torchrun's (env://) variables.

    node 0:  python -m minillm serve --model M --pipeline-parallel-size 2 --nnodes 2 --node-rank 0 \\
                 --dist-init-addr 10.0.0.1:29500
    node 1:  python -m minillm worker --pipeline-parallel-size 2 --nnodes 2 --node-rank 1 \\
                 --dist-init-addr 10.0.0.1:29500 [--node-addr 10.0.0.2]

or the same command on every node under torchrun, one process per node (it starts its ranks):

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --master-addr 10.0.0.1 --master-port 29500 \\
        -m minillm serve --model M --pipeline-parallel-size 2

Every node sets the same MINILLM_DIST_TOKEN. Node R starts its ranks (node.py) and waits for
the head: the weights come from node 0, so node R needs the package, not the model's files.
"""
from __future__ import annotations

import argparse
import os

from .node import run_node
from .world import Layout

ENV = "env://"
NODE_RANK_VARS = ("NODE_RANK", "GROUP_RANK", "RANK")            # ours, torchrun's node, a process per node
NNODES_VARS = ("NNODES", "GROUP_WORLD_SIZE", "WORLD_SIZE")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=None, help="machines in the group (default: $NNODES, torchrun's)")
    p.add_argument("--node-rank", type=int, default=None, help="this machine's node (default: $NODE_RANK, torchrun's)")
    p.add_argument("--dist-init-addr", default=None,
                   help="node 0's HOST:PORT (its rendezvous), or env:// ($MASTER_ADDR:$MASTER_PORT; under torchrun "
                        "the default)")
    add_node_addr(p)


def add_node_addr(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-addr", default=None,
                   help="the address this node's ranks bind to (default: the one that reaches --dist-init-addr)")


def from_env(args) -> None:
    """--dist-init-addr env:// (the default under torchrun): MASTER_ADDR:MASTER_PORT is node 0's
    rendezvous, the node's rank and the node count come from NODE_RANK / NNODES, or torchrun's
    GROUP_RANK / GROUP_WORLD_SIZE, or RANK / WORLD_SIZE (one process per node). A flag given
    wins; one that disagrees with the environment is an error. Sets args' fields in place."""
    env = os.environ
    torchrun = "TORCHELASTIC_RUN_ID" in env
    if args.dist_init_addr != ENV and not (args.dist_init_addr is None and torchrun):
        return
    if torchrun and env.get("LOCAL_WORLD_SIZE", "1") != "1":
        raise ValueError("under torchrun, start one process per node (--nproc-per-node 1): that process starts "
                         "its node's tensor x pipeline ranks itself")
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
    if missing:
        raise ValueError(f"--dist-init-addr env:// reads node 0's address from {' and '.join(missing)}: set them "
                         "(torchrun does)")
    args.dist_init_addr = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    for field, names in (("node_rank", NODE_RANK_VARS), ("nnodes", NNODES_VARS)):
        name = next((n for n in names if env.get(n)), None)
        flag = getattr(args, field)
        if name is None:
            if flag is None:
                raise ValueError(f"--{field.replace('_', '-')} is not given and none of {', '.join(names)} is set")
            continue
        if not env[name].isdigit():
            raise ValueError(f"${name} must be a number, got {env[name]!r}")
        if flag is not None and flag != int(env[name]):
            raise ValueError(f"--{field.replace('_', '-')} {flag} disagrees with ${name}={env[name]}")
        setattr(args, field, int(env[name]))


def main(args) -> int:
    from_env(args)
    if args.nnodes is None or args.node_rank is None:
        raise ValueError("a headless node needs --nnodes and --node-rank (or torchrun's / env:// variables)")
    return headless(args.tensor_parallel_size or 1, args.pipeline_parallel_size or 1, args.nnodes,
                    args.node_rank, args.dist_init_addr, args.node_addr)


def headless(tp: int, pp: int, nnodes: int, node_rank: int, dist_init_addr: str | None, node_addr: str | None) -> int:
    if not dist_init_addr:
        raise ValueError("a headless node needs --dist-init-addr HOST:PORT (node 0's)")
    return run_node(Layout(tp, pp, nnodes), node_rank, dist_init_addr, node_addr)
