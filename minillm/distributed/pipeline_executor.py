"""The engine's side of pipeline parallelism (and of any group that spans machines): it looks
like a ModelRunner to the engine (`apply_block_ops`, `execute`), but runs the model in
T x P ranks (stage_worker.py), this process being the group's rank 0, the driver.

Start: the decoder layers are split into P stages balanced by cost (partition.py, printed),
the store is served at dist_init_addr, node 0's ranks are started with `python -m`, every rank
is admitted by the token (world.py), then each is sent its setup and its stage's weights (the
remote nodes need no model files). A step: the plan goes to every rank as one broadcast
(wire.py, no pickle), stage 0 embeds, each stage passes its hidden states to the next, and the
last stage sends the sampling rows' logits back here. The scheduler, the ONE block manager
(every stage's pool has the same blocks, holding its own layers' K/V), the sampler and the
outputs stay here.

Micro-batches in flight: the step's sequences are cut into up to `micro_batches` (default P)
contiguous micro-batches (partition.micro_batches, balanced by tokens) and the stages run them
in order, each sending micro-batch k on and starting k + 1 at once: stage 0 computes B while
stage 1 computes A, and the pipe idles (P-1)/(m+P-1) of a step instead of (P-1)/P. Every block
decision (allocations, copies, swaps) was made for the whole step before the plan is sent, a
sequence sits in one micro-batch, and every stage runs the micro-batches in the same order, so
each sequence's K/V and tokens are exactly those of one process. The step ends when the last
micro-batch's logits are back: the next step is planned with every token known (vLLM's virtual
engines go further and plan micro-batch A's next step while B is still in the pipe).

Faults: any failed or timed-out wait ends the group; the message names the rank and its node
(its own error from the store, or the node whose heartbeats stopped), every later call raises
PipelineError, node 0's ranks are stopped and the other nodes told (their launchers stop their
ranks). While the engine idles, a keep-alive every KEEPALIVE_S keeps the ranks' waits bounded
and notices a dead node; `failure()` reports it (the server's /health, then exit 1).
"""
from __future__ import annotations

import threading
import time

import torch

from ..runner.model_runner import ForwardOutput
from ..utils.ports import free_port
from . import wire
from .node import ABORT_KEY, start_ranks, stop_ranks
from .partition import balanced_partition, check_split, describe, layer_costs, micro_batches
from .sharding import check_tensor_parallel_size
from .stage import stage_tensor_names
from .world import (Group, Layout, PipelineError, admit, broadcast_bytes, group_token, host_store, recv_bytes,
                    send_bytes, split_addr)

START_TIMEOUT_S = 300.0
STEP_TIMEOUT_S = 120.0       # one step's logits (a long prefill on CPU); a dead peer is heard at once
KEEPALIVE_S = 2.0
SILENT_S = 3.0               # a rank whose heartbeat has not moved for this long is gone
PEER_LOST = ("Connection reset", "Connection closed", "Read error", "Broken pipe", "Timed out", "timed out")
UNSUPPORTED = (("speculative_config", "speculative decoding"), ("enable_lora", "LoRA adapters"),
               ("compile", "compile (torch.compile of decode steps)"), ("quantization", "quantization"))


def refuse_combinations(config) -> None:
    for field, what in UNSUPPORTED:
        if getattr(config, field):
            raise ValueError(f"{field} ({what}) is not supported with pipeline_parallel_size > 1 or nnodes > 1 "
                             "yet: README's 'What combines with what' table lists what is")


class PipelineExecutor:
    def __init__(self, model, resolved, config, verbose: bool = True, partition_fn=None):
        refuse_combinations(config)
        check_tensor_parallel_size(model.config, config.tensor_parallel_size)
        self.layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size, config.nnodes)
        self.model, self.kv_cache, self.resolved, self.config = model, None, resolved, config
        costs = layer_costs(model)
        self.stages = check_split((partition_fn or balanced_partition)(costs, self.layout.pp), len(costs),
                                  self.layout.pp, "partition_fn" if partition_fn else "balanced_partition")
        if verbose:
            print(f"minillm pipeline: {self.layout.pp} stage(s) x {self.layout.tp} tensor-parallel rank(s) over "
                  f"{self.layout.nnodes} node(s)\n{describe(self.stages, costs)}", flush=True)
        self._micro = self.layout.pp              # a step is cut into at most this many (1: the stages take turns)
        self.dead, self.procs, self.lock = None, [], threading.Lock()
        addr = config.dist_init_addr or f"127.0.0.1:{free_port()}"
        self.host, self.port = split_addr(addr)
        token = group_token(config.nnodes)
        self.store = host_store(self.host, self.port, START_TIMEOUT_S)
        self.procs = start_ranks(self.layout, 0, addr, self.host, token)
        try:
            admit(self.store, list(range(1, self.layout.world_size)), token, START_TIMEOUT_S, self.where)
            self.control = Group(self.store, "control", 0, self.layout.world_size, self.host, torch.device("cpu"),
                                 START_TIMEOUT_S)
            self._send_setups()
            for r in range(1, self.layout.world_size):
                self.control.recv(torch.zeros(1), r, START_TIMEOUT_S)           # each rank: ready
        except Exception as e:
            self._die(f"the pipeline group could not start: {e!r}")
        self.last_sent = time.monotonic()
        self.beats = {r: (-1, time.monotonic()) for r in range(1, self.layout.world_size)}
        threading.Thread(target=self._keepalive, daemon=True, name="minillm-pp-keepalive").start()

    @property
    def micro_batches(self) -> int:
        """At most this many micro-batches per step (default P; 1: the stages take turns)."""
        return self._micro

    @micro_batches.setter
    def micro_batches(self, m: int) -> None:
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"micro_batches must be an int >= 1, got {m!r}")
        self._micro = m

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def where(self, rank: int) -> str:
        """"rank r (stage s, node n at ADDR)", as the rank registered itself (else from the layout)."""
        try:
            if self.store.check([f"minillm/where/{rank}"]):
                return self.store.get(f"minillm/where/{rank}").decode()
        except Exception:
            pass
        return f"rank {rank} (stage {self.layout.stage_of(rank)}, node {self.layout.node_of(rank)})"

    def _send_setups(self) -> None:
        state = self.model.state_dict()
        r, c = self.resolved, self.config
        threads = max(1, torch.get_num_threads() // max(1, len(self.layout.ranks_on(0))))
        for rank in range(1, self.layout.world_size):
            stage, layers = self.layout.stage_of(rank), self.stages[self.layout.stage_of(rank)]
            names = stage_tensor_names(state, layers)
            manifest = [[n, list(state[n].shape), str(state[n].dtype).removeprefix("torch.")] for n in names]
            send_bytes(self.control, wire.encode(
                "setup", model_config=model_config_dict(self.model.config), layers=[layers.start, layers.stop],
                stage=stage, stages=self.layout.pp, tp_rank=self.layout.tp_rank_of(rank), tp_size=self.layout.tp,
                device=r.device.type, dtype=str(r.dtype).removeprefix("torch."), num_kv_blocks=r.num_kv_blocks,
                block_size=c.block_size, num_swap_blocks=r.num_swap_blocks, attention_backend=r.attention_backend,
                tensors=manifest, threads=threads), rank)
            for n in names:
                self.control.send(state[n].detach().cpu(), rank, START_TIMEOUT_S)

    def apply_block_ops(self, ops) -> None:
        if ops.swap_out or ops.swap_in or ops.copies:
            with self.lock:
                self._call(lambda: self._broadcast(wire.block_ops_message(ops)))

    def execute(self, scheduled: list) -> ForwardOutput:
        for seq, _ in scheduled:                 # refused before anything is sent: the ranks stay in step
            if seq.params.prompt_logprobs is not None:
                raise ValueError("prompt_logprobs is not supported with pipeline parallelism yet")
            if seq.spec_token_ids or seq.lora_request is not None:
                raise ValueError("speculation and LoRA are not supported with pipeline parallelism")
        parts = micro_batches([n for _, n in scheduled], self.micro_batches) if scheduled else []
        samples = [[seq for seq, n in scheduled[r.start:r.stop] if seq.num_computed_tokens + n == len(seq)] for r in parts]
        last = self.layout.rank(self.layout.pp - 1, 0)
        with self.lock:
            def step():
                self._broadcast(wire.step_message(scheduled, [len(r) for r in parts]))
                rows = [self.control.recv(torch.empty(len(s), self.resolved.vocab_size), last, STEP_TIMEOUT_S)
                        for s in samples if s]             # micro-batch by micro-batch, as they leave the pipe
                return torch.cat(rows) if rows else torch.zeros(0, 0)
            logits = self._call(step)
        return ForwardOutput([seq for s in samples for seq in s], logits, [], {})

    def trace(self, on: bool = True) -> None:
        """Have every rank record the order micro-batches enter and leave its stage (counters()'
        "events": [ticket, step, micro-batch, "in" | "out"], tickets from one shared counter)."""
        with self.lock:
            self._call(lambda: self._broadcast(wire.encode("trace", on=on)))

    def counters(self) -> list[dict]:
        """Each rank's steps, micro-batches, step and busy seconds, seconds in transfers so far,
        and its trace events since the last call (bench pp, tests)."""
        def ask():
            self._broadcast(wire.encode("counters"))
            return [wire.decode(recv_bytes(self.control, r, STEP_TIMEOUT_S))[1]
                    for r in range(1, self.layout.world_size)]
        with self.lock:
            return self._call(ask)

    def _broadcast(self, data: bytes) -> None:
        broadcast_bytes(self.control, data, STEP_TIMEOUT_S)
        self.last_sent = time.monotonic()

    def _call(self, fn):
        if self.dead is not None:
            raise PipelineError(self.dead)
        try:
            return fn()
        except Exception as e:
            self._die(self.diagnose() or f"the pipeline group failed: {e!r}")

    def failure(self) -> str | None:
        return self.dead

    def diagnose(self, wait: float = SILENT_S + 1.0) -> str | None:
        """Which rank failed, or which node went silent (its heartbeats stopped), or None. A rank
        whose error is only a lost peer (a reset connection) is the echo, not the cause: the
        silent node is named if one goes silent within `wait`, the echo otherwise."""
        deadline, echo = time.monotonic() + wait, None
        while True:
            for rank in range(1, self.layout.world_size):
                key = f"minillm/error/{rank}"
                if self.store.check([key]):
                    error = self.store.get(key).decode()
                    if not any(s in error for s in PEER_LOST):
                        return error
                    echo = echo or error
            for p in self.procs:
                if p.poll() is not None and p.returncode < 0:            # killed by a signal here, on node 0
                    return f"a rank on node 0 was killed (signal {-p.returncode})"
            silent = self._silent_ranks()
            if silent:
                # a rank that reported a lost peer and exited went silent *because of* the cause:
                # name the others, the one silent longest first
                cause = [r for r in silent if not self.store.check([f"minillm/error/{r}"])] or silent
                cause.sort(key=lambda r: self.beats[r][1])
                nodes = sorted({self.layout.node_of(r) for r in cause})
                return (f"node {', '.join(map(str, nodes))} stopped answering: {self.where(cause[0])} and "
                        f"{len(cause) - 1} other rank(s) sent no heartbeat for {SILENT_S:.0f} s")
            if time.monotonic() > deadline:
                return echo
            time.sleep(0.2)

    def _silent_ranks(self) -> list[int]:
        now, silent = time.monotonic(), []
        for rank, (count, since) in self.beats.items():
            seen = self.store.add(f"minillm/beat/{rank}", 0)
            if seen != count:
                self.beats[rank] = (seen, now)
            elif now - since > SILENT_S:
                silent.append(rank)
        return silent

    def _keepalive(self) -> None:
        """While the engine idles: a no-op plan every KEEPALIVE_S (the ranks' waits stay bounded, a
        dead peer fails it) and the heartbeats read (a silent node ends the group)."""
        while self.dead is None:
            time.sleep(0.5)
            if not self.lock.acquire(timeout=0.1):
                continue
            try:
                if self.dead is None and self._silent_ranks():
                    self._die(self.diagnose(wait=0) or "a node stopped answering")
                elif self.dead is None and time.monotonic() - self.last_sent > KEEPALIVE_S:
                    self._call(lambda: self._broadcast(wire.encode("noop")))
            except Exception:
                pass                              # _die recorded why; the engine hears it at its next call
            finally:
                self.lock.release()

    def _die(self, message: str):
        self.dead = (f"{message}; the pipeline group is stopped: start every node again "
                     "(README: multi-node, faults)")
        try:
            self.store.set(ABORT_KEY, message[:500])          # the other nodes' launchers stop their ranks
        except Exception:
            pass
        stop_ranks(self.procs, grace=1.0)
        raise PipelineError(self.dead)

    def close(self) -> None:
        if self.dead is None:
            try:
                with self.lock:
                    self._broadcast(wire.encode("stop"))
            except Exception:
                pass
            self.dead = "the engine was closed"
            try:
                self.store.set(ABORT_KEY, "the engine was closed")
            except Exception:
                pass
        stop_ranks(self.procs)

    def __del__(self):
        if getattr(self, "procs", None):
            stop_ranks(self.procs, grace=1.0)


def model_config_dict(cfg) -> dict:
    import dataclasses
    return dataclasses.asdict(cfg)
