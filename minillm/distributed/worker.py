"""One rank's process: join the group, keep only this rank's shard of the model, build an
ordinary ModelRunner on it (its own paged KV pool, holding this rank's KV heads), then run what
the engine sends, in order, until told to stop or the engine is gone.

The messages are the engine's plain data (pickled once by the executor, the same bytes to every
rank): ("block_ops", BlockOps), ("execute", [(Sequence, num_new_tokens)]), ("counters", None),
("stop", None). Every rank runs the same runner code on the same plan, so every rank reaches
the same collectives in the same order. Every rank answers each message; rank 0's answer to
"execute" carries the step's results, the others' only say "done".
"""
from __future__ import annotations

import ctypes
import dataclasses
import pickle
import signal
import sys

import torch

from ..models.llama import LlamaForCausalLM, RotaryEmbedding
from ..runner.model_runner import ModelRunner
from .comm import TensorParallelGroup
from .sharding import shard_decoder_layer, shard_model

COLLECTIVE_TIMEOUT_S = 60.0      # a collective waits this long for a peer before it raises


def die_with_parent() -> None:
    """Linux: the kernel kills this process when the engine's process dies (even by SIGKILL),
    so no rank is left orphaned. Elsewhere the pipe's EOF ends the loop instead."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG = 1


def forward_results(out) -> tuple:
    """A ForwardOutput as plain data for the engine: sequences by id (the engine has its own
    objects), the drafts the runner may have written (self-draft, draft model) with their rows."""
    drafted = {seq_id: (seq.spec_token_ids, rows) for seq_id, (seq, rows) in out.drafted.items()}
    return [s.seq_id for s in out.samplers], out.logits, out.prompt_logprobs, drafted


def rebuild_model(model_config, state_dict):
    """The engine's model from its config and weights (sent through shared memory, not copied):
    the module tree itself does not travel, it holds the CPU kernels' handles."""
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config)
    model.load_state_dict(state_dict, assign=True)
    model.model.rotary = RotaryEmbedding(model_config)      # its frequencies are not in the state dict
    return model.eval()


def run_worker(rank: int, world_size: int, port: int, weights, resolved, config, conn, num_threads: int,
               shard_layer: bytes | None = None) -> None:
    """`shard_layer`: a pickled function sharding one decoder layer (a lesson's, sent by value
    with cloudpickle: a notebook's function cannot be imported here by name); None: the package's."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # Ctrl-C is the engine's to handle; it stops us
    torch.set_num_threads(num_threads)
    try:
        device = torch.device("cuda", rank) if resolved.device.type == "cuda" else resolved.device
        group = TensorParallelGroup(rank, world_size, port, device, COLLECTIVE_TIMEOUT_S)
        shard_layer = pickle.loads(shard_layer) if shard_layer is not None else shard_decoder_layer
        model = shard_model(rebuild_model(*weights), rank, world_size, group, shard_layer)
        del weights
        eager = dataclasses.replace(config, compile=False, enforce_eager=True, tensor_parallel_size=1)
        runner = ModelRunner.build(model, dataclasses.replace(resolved, device=device), eager)
        del model
    except Exception as e:
        conn.send(("error", f"rank {rank} could not start: {e!r}"))
        return
    conn.send(("ready", None))
    serve_plans(runner, group, conn, rank)
    group.close()


def serve_plans(runner, group, conn, rank: int) -> None:
    while True:
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):                     # the engine's end of the pipe closed
            return
        if kind == "stop":
            return
        try:
            if kind == "block_ops":
                runner.apply_block_ops(payload)
                reply = None
            elif kind == "execute":
                out = runner.execute(payload)
                reply = forward_results(out) if rank == 0 else None
            else:                                        # "counters"
                reply = group.counters()
            conn.send(("ok", reply))
        except Exception as e:
            conn.send(("error", f"rank {rank} failed: {e!r}"))
