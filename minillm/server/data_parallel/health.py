"""Which replicas are in rotation: a replica whose process exited, or whose /health does not
answer 200, is out; one that answers again is back in (an exited one never is).

The front checks every replica each `interval` seconds, and at once when a request to one
fails (`lost`), so a replica that dies stops getting requests by the next one, not seconds
later. A replica that exited also loses its prefix tree: whatever it had cached is gone.
"""
from __future__ import annotations

import asyncio
import logging

import httpx

log = logging.getLogger("minillm.server")

INTERVAL = 1.0          # seconds between two rounds of checks
TIMEOUT = 2.0           # seconds a replica has to answer /health


class HealthMonitor:
    def __init__(self, replicas, router, client: httpx.AsyncClient, interval: float = INTERVAL):
        self.replicas, self.router, self.client, self.interval = replicas, router, client, interval

    async def run(self) -> None:
        """Check every replica, forever (the app cancels this task when it stops)."""
        while True:
            await asyncio.gather(*(self.check(i) for i in range(len(self.replicas))))
            await asyncio.sleep(self.interval)

    async def check(self, i: int) -> bool:
        """Is replica i up? Takes it out of rotation (or puts it back) accordingly."""
        replica = self.replicas[i]
        if replica.exited():
            if not replica.exit_reported:
                replica.exit_reported = True
                self.router.forget(i)
                log.error("%s exited with %s; it is out of rotation (its log: %s)", replica.describe(),
                          replica.process.returncode, replica.log)
            self.router.set_up(i, False)
            return False
        try:
            up = (await self.client.get(f"{replica.url}/health", timeout=TIMEOUT)).status_code == 200
        except httpx.HTTPError:
            up = False
        if self.router.set_up(i, up):
            log.warning("%s is %s", replica.describe(), "back in rotation" if up else "out of rotation: "
                        "/health does not answer 200")
        return up

    async def lost(self, i: int, error: Exception) -> None:
        """A request to replica i failed on the connection: check it now."""
        log.warning("%s: request failed: %r", self.replicas[i].describe(), error)
        await self.check(i)
