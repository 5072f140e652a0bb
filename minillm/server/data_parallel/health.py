"""Which replicas are in rotation: a replica whose process exited, or whose /health does not
answer 200, is out; one that answers again is back in. One that exited is started again
(healing.py); one given by URL (remote.py) is checked the same way but never restarted.

The front checks every replica each `interval` seconds, and at once when a request to one
fails (`lost`), so a replica that dies stops getting requests by the next one, not seconds
later. A replica that exited also loses its prefix tree: whatever it had cached is gone.

A replica that runs but has not answered /health for `replica_timeout` seconds is hung
(stopped, deadlocked, its engine gone): `hung(i)` is then set, and the proxy ends its requests
in flight with an error instead of waiting for bytes that may never come. The timeout is on
the replica's silence, not on a request's length: a replica that answers its health checks is
alive, however long its generations or its queue.
"""
from __future__ import annotations

import asyncio
import logging
import time

import httpx

from .replicas import log_tail

log = logging.getLogger("minillm.server")

INTERVAL = 1.0          # seconds between two rounds of checks
TIMEOUT = 2.0           # seconds a replica has to answer /health
REPLICA_TIMEOUT = 60.0  # seconds of silence after which a replica's requests in flight fail


class HealthMonitor:
    def __init__(self, replicas, router, client: httpx.AsyncClient, interval: float = INTERVAL,
                 replica_timeout: float = REPLICA_TIMEOUT, healer=None):
        self.replicas, self.router, self.client, self.interval = replicas, router, client, interval
        self.replica_timeout, self.healer = replica_timeout, healer
        now = time.monotonic()
        self.last_answer = [now] * len(replicas)       # when each last answered /health with 200
        self._hung = [asyncio.Event() for _ in replicas]

    def hung(self, i: int) -> asyncio.Event:
        """Set once replica i has been silent for replica_timeout seconds (a request routed
        there keeps the event it got: a later recovery does not bring its answer back)."""
        return self._hung[i]

    async def run(self) -> None:
        """Check every replica, forever (the app cancels this task when it stops)."""
        while True:
            try:
                await asyncio.gather(*(self.check(i) for i in range(len(self.replicas))))
            except Exception:                    # a bug of ours must not stop the checks for good
                log.exception("a round of health checks failed")
            await asyncio.sleep(self.interval)

    async def check(self, i: int) -> bool:
        """Is replica i up? Takes it out of rotation (or puts it back) accordingly."""
        replica = self.replicas[i]
        if replica.exited():
            if not replica.exit_reported:
                replica.exit_reported = True
                self.router.forget(i)
                if replica.terminated:
                    log.info("%s stopped", replica.describe())
                else:
                    log.error("%s exited with %s; it is out of rotation. The end of its log (%s):\n%s",
                              replica.describe(), replica.process.returncode, replica.log,
                              log_tail(replica.log, 2000))
            self.router.set_up(i, False)
            if self.healer is not None and await self.healer.exited(i):
                self.last_answer[i], self._hung[i] = time.monotonic(), asyncio.Event()    # a new process
            return False
        try:
            up = (await self.client.get(f"{replica.url}/health", timeout=TIMEOUT)).status_code == 200
        except httpx.HTTPError:
            up = False
        if self.healer is not None:
            self.healer.answered(i, up)
        now = time.monotonic()
        if up:
            self.last_answer[i] = now
            if self._hung[i].is_set():
                self._hung[i] = asyncio.Event()
        elif (now - self.last_answer[i] >= self.replica_timeout and not self._hung[i].is_set()
              and not (self.healer and self.healer.state[i].started)):      # not a restart still loading
            self._hung[i].set()
            log.error("%s has not answered for %.0f s: its requests in flight end with an error",
                      replica.describe(), now - self.last_answer[i])
        if self.router.set_up(i, up):
            log.warning("%s is %s%s", replica.describe(), "back in rotation" if up else "out of rotation: "
                        "/health does not answer 200", "" if up or not replica.external else
                        " (this front did not start it and never restarts it: whoever started it must)")
        return up

    async def lost(self, i: int, error: Exception) -> None:
        """A request to replica i failed on the connection: check it now."""
        log.warning("%s: request failed: %r", self.replicas[i].describe(), error)
        await self.check(i)

    def summary(self) -> dict:
        """The front's capacity, for its /health: replicas up, restarting, failed."""
        n, up = len(self.replicas), [i for i, u in enumerate(self.router.up) if u]
        restarting = [i for i in range(n) if self.healer and self.healer.restarting(i) and i not in up]
        failed = [i for i in range(n) if self.healer and self.healer.state[i].failed]
        status = "ok" if len(up) == n else "degraded" if up else "unavailable"
        external = [r.index for r in self.replicas if r.external]       # given by URL: never restarted here
        return {"status": status, "replicas": n, "replicas_up": len(up), "restarting": restarting, "failed": failed,
                "external": external}
