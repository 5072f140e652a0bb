"""Tensor parallelism: one model's layers sharded over several processes that all-reduce
(lesson 10). The engine (scheduler, block manager, sampler, outputs) stays in its own process
and sends each step's plan, plain data, to the ranks; every rank runs the same forward on its
shard of every layer.

    comm.py      the process group (gloo on CPU, NCCL on CUDA) and its two collectives, timed
    sharding.py  Megatron-style shards: column- and row-parallel linears, vocab-parallel embedding and head
    worker.py    one rank's process: shard the model, then run the plans it is sent
    executor.py  the engine's side: start the ranks, send plans, gather logits, notice a dead rank
    recovery.py  a group whose rank died started again (the server does it), with bounded retries

Pipeline parallelism and groups across machines (pipeline_parallel_size > 1 or nnodes > 1):
    partition.py          the layers split into stages balanced by cost
    world.py              who is who, the token-checked TCPStore rendezvous, the torch.distributed groups
    wire.py               the plans as schema-checked plain data, never pickle
    stage.py              one stage: its layers, its KV pool, its part of a step
    stage_worker.py       a rank's process (`python -m minillm.distributed.stage_worker`)
    pipeline_executor.py  the engine's side: setup, weights, steps, faults named by node
    node.py, launch.py    a node's ranks started and watched; `python -m minillm worker`
"""
from .sharding import check_tensor_parallel_size

__all__ = ["check_tensor_parallel_size"]
