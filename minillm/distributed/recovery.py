"""Starting a tensor-parallel group again after a rank died (the server's engine loop calls this).

A dead rank leaves its peers out of step and every rank's KV pool in an unknown state, so nothing
of the old group is kept: every request still in the engine ends (the server has told its
clients), the prefix cache forgets every block (the new ranks' pools are empty), and the executor
spawns a fresh group from the same weights, which then gives the same tokens as before.

A restart can fail too (memory is short, a GPU is gone): it is tried `attempts` times, waiting
`backoff`, 2 x backoff, ... seconds between tries, then RestartFailed: the server exits non-zero
and the orchestrator starts it afresh. An engine whose runner cannot restart (one process,
tensor_parallel_size 1) has nothing to restart: its failures are bugs, not lost processes.

A group across machines (nnodes > 1) is not restarted in place either: the other nodes' processes
are not ours to start. The head stays up and says why (`lost_group`: the nodes named, what the
operator does next) on /health and to every new request, until the operator restarts the group.
"""
from __future__ import annotations

import logging
import re
import time

log = logging.getLogger("minillm.server")

RESTART_ATTEMPTS = 3
RESTART_BACKOFF_S = 1.0
OPERATOR_ACTION = ("restart the group: stop this server and start every node's command again, node 0's included "
                   "(the group is never restarted in place; README: multi-node, faults)")


class RestartFailed(RuntimeError):
    """Every attempt to start the group again failed: only a new process can help."""


def runner_failure(engine) -> str | None:
    """Why the engine's runner cannot run a step (a TP rank died), or None."""
    failure = getattr(engine.runner, "failure", None)
    return failure() if failure is not None else None


def can_restart(engine) -> bool:
    return hasattr(engine.runner, "restart")


def forget_prefix_cache(block_manager) -> None:
    """No block holds a known prefix any more (the pools they named are gone)."""
    cache = block_manager.prefix_cache
    if cache is not None:
        for block in range(block_manager.allocator.num_blocks):
            cache.forget(block)


def restart_runner(engine, attempts: int = RESTART_ATTEMPTS, backoff: float = RESTART_BACKOFF_S,
                   sleep=time.sleep) -> int:
    """End every request, forget the prefix cache, start the runner's processes again (module
    doc). Returns the attempts it took; raises RestartFailed after `attempts` failures."""
    engine.shutdown()                       # every request ends ("abort") and frees its blocks
    forget_prefix_cache(engine.block_manager)
    error = None
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            sleep(backoff * 2 ** (attempt - 2))
        try:
            engine.runner.restart()
            return attempt
        except Exception as e:              # TensorParallelError: a rank could not start
            error = e
            log.error("restarting the tensor-parallel group failed (attempt %d of %d): %s", attempt, attempts, e)
    raise RestartFailed(f"the tensor-parallel group could not be started again after {attempts} attempts: {error}")


def lost_group(engine, reason: str) -> dict | None:
    """A multi-node group failed (module doc): what /health adds to its 503, the nodes its reason
    names ('node 1 stopped answering: ...', 'rank 2 (stage 1, node 1 at 10.0.0.2) failed: ...')
    and the operator's next step. None for a group on one machine."""
    if getattr(engine.config, "nnodes", 1) <= 1:
        return None
    named = re.search(r"\bnodes? (\d+(?:, \d+)*)", reason)
    nodes = sorted({int(n) for n in named.group(1).split(", ")}) if named else []
    return {"failed_nodes": nodes, "action": OPERATOR_ACTION}
