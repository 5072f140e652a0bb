"""The engine's side of tensor parallelism: it looks like a ModelRunner to the engine
(`apply_block_ops`, `execute`), but runs the model in N rank processes (worker.py).

Per step the plan is pickled once and the same bytes go down each rank's pipe: `bench tp` measured a
4.3 KB decode plan (8 sequences) at 40 us down a pipe against 900 us for gloo's broadcast_object_list
(2-core EPYC, quiet); rank 0 sends back the
sampling rows' logits, which the engine samples from as usual. The scheduler, the block
manager (one for all ranks: every rank's pool has the same blocks, holding its own KV heads),
the sampler and the outputs stay in the engine's process.

A rank that dies, or raises, ends the group: the ranks are then out of step, so the executor
stops them all and every later call raises `TensorParallelError` at once, which ends each
request still in the engine with that message. `failure()` says so without a message to the
ranks (a rank killed while the engine idles is seen too), and `restart()` starts a fresh group
from the same weights (the server does, distributed/recovery.py). The ranks die with the
engine's process (PR_SET_PDEATHSIG), when the executor is garbage-collected, at interpreter
exit, and on `close()`.
"""
from __future__ import annotations

import pickle
import time
import weakref

import torch
import torch.multiprocessing as mp
from multiprocessing.connection import wait

from ..attention.paged import slot_mapping
from ..runner.model_runner import ForwardOutput, ModelRunner
from .sharding import check_tensor_parallel_size
from .worker import run_worker
from ..utils.ports import free_port

START_TIMEOUT_S = 300.0        # spawning a rank imports torch and shards the model
STEP_TIMEOUT_S = 180.0         # a step's answers; a hung rank makes its peers' collectives fail first (60 s)


class TensorParallelError(RuntimeError):
    """A rank died or failed: the engine cannot go on."""


def build_runner(model, resolved, config, slot_mapping_fn=slot_mapping, shard_layer_fn=None, partition_fn=None):
    """The engine's runner: a ModelRunner in this process, or N ranks with tensor_parallel_size N
    (each sharding every decoder layer with `shard_layer_fn`, default sharding.shard_decoder_layer),
    or pipeline stages (layers split by `partition_fn`, default partition.balanced_partition)."""
    check_group_options(config)
    if getattr(config, "pipeline_parallel_size", 1) > 1 or getattr(config, "nnodes", 1) > 1:
        if slot_mapping_fn is not slot_mapping or shard_layer_fn is not None:
            raise ValueError("a custom slot_mapping_fn or shard_layer_fn runs with pipeline_parallel_size=1 and "
                             "nnodes=1 only")
        from .pipeline_executor import PipelineExecutor          # stages, possibly across machines
        return PipelineExecutor(model, resolved, config, partition_fn=partition_fn)
    if partition_fn is not None:
        raise ValueError("partition_fn splits the layers into pipeline stages: use pipeline_parallel_size >= 2")
    if config.tensor_parallel_size == 1:
        if shard_layer_fn is not None:
            raise ValueError("shard_layer_fn shards the layers over ranks: use tensor_parallel_size >= 2")
        return ModelRunner.build(model, resolved, config, slot_mapping_fn)
    if slot_mapping_fn is not slot_mapping:
        raise ValueError("a custom slot_mapping_fn runs in this process only: use tensor_parallel_size=1")
    return TensorParallelExecutor(model, resolved, config, shard_layer_fn)


def check_group_options(config) -> None:
    """The multi-node options together: an engine is node 0; nnodes > 1 needs node 0's address."""
    nnodes, node_rank = getattr(config, "nnodes", 1), getattr(config, "node_rank", 0)
    if node_rank >= nnodes:
        raise ValueError(f"node_rank={node_rank} must be less than nnodes={nnodes}")
    if node_rank > 0:
        raise ValueError(f"node_rank={node_rank} is a headless node, not an engine: run `python -m minillm worker` "
                         "(or `serve --node-rank R`) there")
    if nnodes > 1 and not getattr(config, "dist_init_addr", None):
        raise ValueError(f"nnodes={nnodes} needs dist_init_addr HOST:PORT (node 0's address, where the others join)")


def pickled_by_value(fn) -> bytes:
    """`fn` as bytes a spawned rank can load: cloudpickle sends a function defined in a notebook
    (or a script's __main__) by value, where plain pickle would send a name the rank cannot import."""
    import cloudpickle
    return cloudpickle.dumps(fn)


class TensorParallelExecutor:
    def __init__(self, model, resolved, config, shard_layer_fn=None):
        n = config.tensor_parallel_size
        check_tensor_parallel_size(model.config, n)
        if resolved.device.type == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs, this machine has {torch.cuda.device_count()}")
        self.model, self.kv_cache, self.size, self.dead = model, None, n, None
        self.resolved, self.config = resolved, config
        self.shard_layer = None if shard_layer_fn is None else pickled_by_value(shard_layer_fn)
        self._start()

    def _start(self) -> None:
        """Spawn the ranks and wait until each has its shard (raises TensorParallelError if one cannot)."""
        ctx, n = mp.get_context("spawn"), self.size
        port, threads = free_port(), max(1, torch.get_num_threads() // n)
        weights = (self.model.config, self.model.state_dict())      # shared memory, not copies (worker.py)
        self.conns, self.procs = [], []
        for rank in range(n):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=run_worker, daemon=True, name=f"minillm-tp-rank{rank}",
                               args=(rank, n, port, weights, self.resolved, self.config, theirs, threads,
                                     self.shard_layer))
            proc.start()
            theirs.close()
            self.conns.append(ours)
            self.procs.append(proc)
        self._finalizer = weakref.finalize(self, stop_ranks, self.procs, self.conns)    # also at exit
        self._replies(START_TIMEOUT_S)

    def restart(self) -> None:
        """Stop every rank and start a fresh group from the same weights. Each rank's KV pool starts
        empty, so the caller must have ended every request and forgotten the prefix cache."""
        self._finalizer()
        self.dead = None
        self._start()

    def failure(self) -> str | None:
        """Why this group cannot run a step (a rank died, or failed, or the group was closed), or
        None. Cheap: it asks the operating system, not the ranks."""
        return self.dead or self._dead_rank(grace=0)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def apply_block_ops(self, ops) -> None:
        if ops.swap_out or ops.swap_in or ops.copies:
            self._send("block_ops", ops)
            self._replies()

    def execute(self, scheduled: list) -> ForwardOutput:
        """Every rank runs the plan; rank 0's results are mapped back onto this process's sequences."""
        self._send("execute", scheduled)
        seq_ids, logits, prompt_logprobs, drafted = self._replies()[0]
        by_id = {seq.seq_id: seq for seq, _ in scheduled}
        for seq_id, (drafts, _) in drafted.items():
            by_id[seq_id].spec_token_ids = drafts              # a rank-side proposer may have written them
        return ForwardOutput([by_id[i] for i in seq_ids], logits, prompt_logprobs,
                             {seq_id: (by_id[seq_id], rows) for seq_id, (_, rows) in drafted.items()})

    def counters(self) -> list[dict]:
        """Each rank's time and bytes in collectives so far (bench tp)."""
        self._send("counters", None)
        return self._replies()

    def _send(self, kind: str, payload) -> None:
        if self.dead is not None:
            raise TensorParallelError(self.dead)
        data = pickle.dumps((kind, payload))
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as e:
            self._die(f"could not reach a tensor-parallel rank: {e!r}")

    def _replies(self, timeout: float = STEP_TIMEOUT_S) -> list:
        """Each rank's answer, in rank order, read as they come (a rank that failed is heard at
        once, not after its peers' collectives time out); a dead or failing rank ends the engine."""
        deadline = time.monotonic() + timeout
        replies, waiting = {}, dict(enumerate(self.conns))
        while waiting:
            for conn in wait(list(waiting.values()), 0.05):
                rank = self.conns.index(conn)
                try:
                    status, reply = conn.recv()
                except (EOFError, OSError):
                    self._die(self._dead_rank(grace=1.0) or f"tensor-parallel rank {rank} closed its pipe")
                if status == "error":                  # a peer's death shows up first as a failed collective
                    self._die(self._dead_rank(grace=1.0, killed_only=True) or reply[:300])
                replies[rank] = reply
                del waiting[rank]
            if waiting and (dead := self._dead_rank(grace=0)):
                self._die(dead)
            if waiting and time.monotonic() > deadline:
                self._die(f"tensor-parallel ranks {sorted(waiting)} did not answer within {timeout:.0f} s")
        return [replies[r] for r in range(len(self.conns))]

    def _dead_rank(self, grace: float, killed_only: bool = False) -> str | None:
        """"rank r died (exit code c)" for the first rank found dead within `grace` seconds, else None.
        killed_only: a rank that exited 0 does not count (it returned after sending its own error,
        which is then the better message: a rank that failed to start)."""
        deadline = time.monotonic() + grace
        while True:
            for rank, proc in enumerate(self.procs):
                if not proc.is_alive() and not (killed_only and proc.exitcode == 0):
                    return f"tensor-parallel rank {rank} died (exit code {proc.exitcode})"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def _die(self, message: str):
        self.dead = f"{message}; the tensor-parallel ranks are stopped (restart() starts new ones)"
        for proc in self.procs:             # the survivors wait in a collective: no use asking them to stop
            if proc.is_alive():
                proc.kill()
        self.close()
        raise TensorParallelError(self.dead)

    def close(self) -> None:
        """Stop every rank (idempotent)."""
        self.dead = self.dead or "the engine was closed"
        self._finalizer()


def stop_ranks(procs, conns) -> None:
    for conn in conns:
        try:
            conn.send_bytes(pickle.dumps(("stop", None)))
        except OSError:
            pass
    deadline = time.monotonic() + 5
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    for conn in conns:
        conn.close()
