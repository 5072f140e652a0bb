"""Who is who in a multi-process (multi-node) group, and how they find each other.

    rank 0             the driver: the engine (scheduler, block manager, sampler) on node 0
    rank 1 + s*T + t   stage s's tensor-parallel rank t (T = tensor_parallel_size)

Rendezvous is torch.distributed's TCPStore at --dist-init-addr, served by the driver (bound to
that address only: we hand it the listening socket); under torchrun, the store its agent on node
0 already serves at MASTER_ADDR:MASTER_PORT (what torch's own env:// does there). Before anyone
builds a process group, each rank proves it knows the group's token (an HMAC of a fresh nonce,
never the token itself) and so does the driver: a stranger who reaches the port cannot join, and
a rank cannot be lured into a stranger's group. The groups are torch.distributed's own ProcessGroupGloo / ProcessGroupNCCL,
built directly on the store with this node's address (gloo binds only there):
    control   every rank, gloo: plans (wire.py), the setup and weights, the logits back
    tp        a stage's T ranks: the all-reduces of tensor parallelism (NCCL on CUDA)
    pair      stage s rank t -> stage s+1 rank t: the hidden states (NCCL on CUDA)
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

TOKEN_ENV = "MINILLM_DIST_TOKEN"


class PipelineError(RuntimeError):
    """A rank or a node failed, or stopped answering: the group cannot go on."""


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    nnodes: int = 1

    def __post_init__(self):
        if (self.tp * self.pp) % self.nnodes:
            raise ValueError(f"tensor_parallel_size x pipeline_parallel_size = {self.tp * self.pp} ranks must "
                             f"divide evenly over nnodes={self.nnodes} (the same number of ranks on every node)")

    @property
    def world_size(self) -> int:
        return 1 + self.tp * self.pp

    @property
    def per_node(self) -> int:
        return self.tp * self.pp // self.nnodes

    def rank(self, stage: int, t: int) -> int:
        return 1 + stage * self.tp + t

    def stage_of(self, rank: int) -> int:
        return (rank - 1) // self.tp

    def tp_rank_of(self, rank: int) -> int:
        return (rank - 1) % self.tp

    def node_of(self, rank: int) -> int:
        return 0 if rank == 0 else (rank - 1) // self.per_node

    def ranks_on(self, node: int) -> list[int]:
        return [r for r in range(1, self.world_size) if self.node_of(r) == node]


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"dist_init_addr must be HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


def own_address(head_host: str, head_port: int) -> str:
    """The address this machine reaches the head from (no packet is sent: a UDP 'connect' only
    picks the route): what a node's ranks bind to unless told otherwise."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((head_host, head_port))
        return s.getsockname()[0]


def group_token(nnodes: int) -> str:
    """The shared secret: $MINILLM_DIST_TOKEN, required across machines; on one machine a fresh
    random one (handed to the ranks this process starts)."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    if nnodes > 1:
        raise ValueError(f"a group across machines needs a shared secret: set {TOKEN_ENV} to the same value on "
                         "every node (e.g. `export MINILLM_DIST_TOKEN=$(python -c 'import secrets; "
                         "print(secrets.token_hex(16))')`)")
    return secrets.token_hex(16)


def _proof(token: str, nonce: str, who: str) -> str:
    return hmac.new(token.encode(), f"{nonce}/{who}".encode(), hashlib.sha256).hexdigest()


def agent_store(host: str, port: int, timeout_s: float):
    """Under torchrun, its agent on node 0 serves a TCPStore at MASTER_ADDR:MASTER_PORT for the
    whole run (TORCHELASTIC_USE_AGENT_STORE): every process of ours joins it as a client, our keys
    under a prefix of this attempt (torch's env:// rendezvous does the same). None elsewhere."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or \
            (host, str(port)) != (env.get("MASTER_ADDR", "").strip("[]"), env.get("MASTER_PORT")):
        return None
    client = TCPStore(host, port, None, False, timedelta(seconds=timeout_s))
    return PrefixStore(f"/minillm/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def host_store(host: str, port: int, timeout_s: float) -> TCPStore:
    """The driver's TCPStore, listening on host:port only (torchrun's agent's, if it serves one)."""
    shared = agent_store(host, port, timeout_s)
    if shared is not None:
        return shared
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return TCPStore(host, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False,
                    master_listen_fd=sock.detach())


def join_store(host: str, port: int, timeout_s: float) -> TCPStore:
    shared = agent_store(host, port, timeout_s)
    if shared is not None:
        return shared
    return TCPStore(host, port, None, False, timedelta(seconds=timeout_s))


def admit(store: TCPStore, ranks: list[int], token: str, timeout_s: float, where=lambda r: f"rank {r}") -> None:
    """Driver: publish a nonce and its own proof, then check every rank's (PipelineError names a
    rank that is missing or wrong; every rank is told 'refused' then, and exits)."""
    nonce = secrets.token_hex(16)
    store.set("minillm/nonce", nonce)
    store.set("minillm/proof/0", _proof(token, nonce, "driver"))
    deadline = time.monotonic() + timeout_s
    for r in ranks:
        key = f"minillm/proof/{r}"
        while not store.check([key]):
            if time.monotonic() > deadline:
                store.set("minillm/admitted", "refused")
                raise PipelineError(f"{where(r)} did not join within {timeout_s:.0f} s (is its node started, "
                                    "with the same --dist-init-addr?)")
            time.sleep(0.05)
        if not hmac.compare_digest(store.get(key).decode(), _proof(token, nonce, f"rank{r}")):
            store.set("minillm/admitted", "refused")
            raise PipelineError(f"{where(r)} presented a wrong token: every node needs the same {TOKEN_ENV}")
    store.set("minillm/admitted", "yes")


def prove(store: TCPStore, rank: int, token: str) -> None:
    """A rank: give our proof (bound to this nonce and rank: worthless elsewhere; the driver can
    then say 'wrong token' at once), check the driver's, wait to be admitted (PipelineError if not)."""
    store.wait(["minillm/nonce", "minillm/proof/0"])
    nonce = store.get("minillm/nonce").decode()
    store.set(f"minillm/proof/{rank}", _proof(token, nonce, f"rank{rank}"))
    if not hmac.compare_digest(store.get("minillm/proof/0").decode(), _proof(token, nonce, "driver")):
        raise PipelineError(f"the driver at this address does not know our {TOKEN_ENV}: refusing to join it")
    store.wait(["minillm/admitted"])
    if store.get("minillm/admitted") != b"yes":
        raise PipelineError("the driver refused the group (a rank's token was wrong or a rank never came)")


class Group:
    """One torch.distributed process group used directly (no global default group), each wait
    bounded by `timeout_s`; the collectives TP sharding calls (sharding.py), counted like comm.py's."""

    def __init__(self, store, name: str, rank: int, size: int, bind: str, device: torch.device, timeout_s: float):
        prefixed = PrefixStore(name, store)
        self.timeout = timedelta(seconds=timeout_s)
        if device.type == "cuda":
            from torch.distributed import ProcessGroupNCCL
            options = ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            self.pg = ProcessGroupNCCL(prefixed, rank, size, options)
        else:
            options = ProcessGroupGloo._Options()
            options._timeout = self.timeout
            options._devices = [ProcessGroupGloo.create_device(hostname=bind)]
            self.pg = ProcessGroupGloo(prefixed, rank, size, options)
        self.rank, self.size, self.name = rank, size, name
        self.seconds, self.bytes, self.calls = 0.0, 0, 0

    def _run(self, work, tensor, start: float, timeout: timedelta | None = None):
        work.wait(timeout or self.timeout)
        self.seconds += time.perf_counter() - start
        self.bytes += tensor.numel() * tensor.element_size()
        self.calls += 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self._run(self.pg.allreduce([x]), x, time.perf_counter())
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        start, x = time.perf_counter(), x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._run(self.pg.allgather([parts], [x]), x, start)
        return torch.cat(parts, dim=-1)

    def send(self, x: torch.Tensor, dst: int, timeout_s: float | None = None) -> None:
        self._run(self.pg.send([x.contiguous()], dst, 0), x, time.perf_counter(),
                  timedelta(seconds=timeout_s) if timeout_s else None)

    def recv(self, x: torch.Tensor, src: int, timeout_s: float | None = None) -> torch.Tensor:
        self._run(self.pg.recv([x], src, 0), x, time.perf_counter(), timedelta(seconds=timeout_s) if timeout_s else None)
        return x

    def broadcast(self, x: torch.Tensor, root: int = 0, timeout_s: float | None = None) -> torch.Tensor:
        self._run(self.pg.broadcast(x, root), x, time.perf_counter(),
                  timedelta(seconds=timeout_s) if timeout_s else None)
        return x

    def counters(self) -> dict:
        return {"comm_seconds": self.seconds, "comm_bytes": self.bytes, "comm_calls": self.calls}


def send_bytes(group: Group, data: bytes, dst: int) -> None:
    group.send(torch.tensor([len(data)], dtype=torch.long), dst)
    group.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst)


def recv_bytes(group: Group, src: int, timeout_s: float | None = None) -> bytes:
    n = group.recv(torch.zeros(1, dtype=torch.long), src, timeout_s)
    return group.recv(torch.empty(int(n), dtype=torch.uint8), src, timeout_s).numpy().tobytes()


def broadcast_bytes(group: Group, data: bytes | None, timeout_s: float | None = None) -> bytes:
    """Root (rank 0) gives `data`, everyone returns it: a length, then the bytes (two broadcasts)."""
    n = group.broadcast(torch.tensor([len(data) if data is not None else 0], dtype=torch.long), 0, timeout_s)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None else torch.empty(int(n), dtype=torch.uint8)
    return group.broadcast(buf, 0, timeout_s).numpy().tobytes()
