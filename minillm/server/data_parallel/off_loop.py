"""The routing text of a big body, read in a worker process: the front's event loop never
waits for a parse whose cost grows with the request.

`json.loads` is one C call that holds the GIL for as long as the body is big (1.5 MB of
`{"prompt": [[1], [1], ...]}`: about half a second), so even on a worker thread it stops the
event loop, and every stream the front relays, meanwhile. Above the replicas' own threshold
(`body_parsing.OFF_LOOP_BYTES`, 64 KB) the front reads the routing text in a process of its
own (spawned at the first such body, at a lower CPU priority); below it a thread does, in well
under a millisecond. A worker that dies costs only the routing hint: the request goes to the
least loaded replica, which validates it as usual.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os

from ..body_parsing import OFF_LOOP_BYTES
from .prompts import routing_text

log = logging.getLogger("minillm.server")


def lower_priority() -> None:
    """The worker gets only the CPU the replicas leave."""
    if hasattr(os, "nice"):
        os.nice(10)


class RoutingText:
    def __init__(self):
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None

    async def __call__(self, path: str, body: bytes) -> str | None:
        """routing_text(path, body), off the event loop; raises prompts.TooDeep."""
        if len(body) <= OFF_LOOP_BYTES:
            return await asyncio.to_thread(routing_text, path, body)
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(1, multiprocessing.get_context("spawn"),
                                                               initializer=lower_priority)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, routing_text, path, body)
        except concurrent.futures.process.BrokenProcessPool:
            log.warning("the routing worker process died; a new one starts with the next big body")
            self.pool = None
            return None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
