"""Tensor parallelism: one model's layers sharded over several processes that all-reduce
(lesson 10). The engine (scheduler, block manager, sampler, outputs) stays in its own process
and sends each step's plan, plain data, to the ranks; every rank runs the same forward on its
shard of every layer.

    comm.py      the process group (gloo on CPU, NCCL on CUDA) and its two collectives, timed
    sharding.py  Megatron-style shards: column- and row-parallel linears, vocab-parallel embedding and head
    worker.py    one rank's process: shard the model, then run the plans it is sent
    executor.py  the engine's side: start the ranks, send plans, gather logits, notice a dead rank
    recovery.py  a group whose rank died started again (the server does it), with bounded retries
"""
from .sharding import check_tensor_parallel_size

__all__ = ["check_tensor_parallel_size"]
