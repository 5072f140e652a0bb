"""A replica whose process exited is started again: after a pause that doubles with each
attempt, at most `max_restarts` times in a row, as Kubernetes' CrashLoopBackOff does.

    exited ──(backoff: 1, 2, 4, ... s, at most 30)──► restarted ──(/health 200)──► up
       ▲                                                  │ not ready in time: killed
       └──────────────────────────────────────────────────┘
    a replica up for STABLE seconds starts its count again; one that used every attempt has
    failed, and when every replica has failed the front exits non-zero (main.py): its
    orchestrator restarts it, which is a better bet than a front that can serve nothing.

A replica that stops answering but has not exited (hung, or its engine reporting 503) is not
restarted: it may come back (health.py takes it out of rotation and fails its requests in
flight after --replica-timeout). The health monitor calls `exited` and `answered` on each of its
rounds; this class decides, and restarts through the replica's launcher (replicas.py).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

from .replicas import READY_TIMEOUT, Replica, _signal_group

log = logging.getLogger("minillm.server")

MAX_RESTARTS = 5        # attempts in a row before a replica is given up
BACKOFF = 1.0           # seconds before the first attempt; doubled for each next one
MAX_BACKOFF = 30.0
STABLE = 60.0           # seconds up after which a replica's attempts count from 0 again


def backoff(attempt: int, first: float = BACKOFF) -> float:
    """Seconds to wait before attempt number `attempt` (1, 2, ...)."""
    return min(first * 2 ** (attempt - 1), MAX_BACKOFF)


@dataclass
class Healing:
    attempts: int = 0                 # restarts in a row that have not (yet) proved stable
    restarts: int = 0                 # ever
    due: float | None = None          # when the next start is due (monotonic clock)
    started: float | None = None      # a restarted process waiting to answer /health, since
    up_since: float | None = None
    spawning: bool = False            # a start under way (in a worker thread)
    failed: bool = False              # every attempt used: it stays down


class Healer:
    def __init__(self, replicas: list[Replica], metrics, max_restarts: int = MAX_RESTARTS,
                 first_backoff: float = BACKOFF, ready_timeout: float = READY_TIMEOUT, on_all_failed=None):
        self.replicas, self.metrics, self.max_restarts = replicas, metrics, max_restarts
        self.first_backoff, self.ready_timeout, self.on_all_failed = first_backoff, ready_timeout, on_all_failed
        self.state = [Healing() for _ in replicas]

    def restarting(self, i: int) -> bool:
        return not self.state[i].failed and (self.state[i].due is not None or self.state[i].started is not None)

    async def exited(self, i: int) -> bool:
        """Replica i's process has exited: plan its next start, or start it if that is due.
        True when a new process was started."""
        replica, h = self.replicas[i], self.state[i]
        if h.failed or h.spawning or replica.launcher is None or replica.launcher.stopping:
            return False
        now = time.monotonic()
        h.started = h.up_since = None
        if h.due is None:
            if h.attempts >= self.max_restarts:
                self._give_up(i)
                return False
            h.attempts += 1
            h.due = now + backoff(h.attempts, self.first_backoff)
            log.warning("%s: restart %d of %d in %.0f s", replica.describe(), h.attempts, self.max_restarts,
                        h.due - now)
            return False
        if now < h.due:
            return False
        h.due, h.spawning = None, True
        try:
            if not await asyncio.to_thread(replica.launcher.restart, replica):
                return False                   # the front is stopping
        except OSError as e:                   # e.g. no free port, no memory for a process: the next attempt
            log.error("%s could not be started again: %s", replica.describe(), e)
            return False
        finally:
            h.spawning = False
        h.started, h.restarts = time.monotonic(), h.restarts + 1
        self.metrics.restarted(i)
        log.warning("%s started again (restart %d of %d); log %s", replica.describe(), h.attempts,
                    self.max_restarts, replica.log)
        return True

    def answered(self, i: int, up: bool) -> None:
        """Replica i's process runs, and its /health answered 200 (up) or not."""
        replica, h, now = self.replicas[i], self.state[i], time.monotonic()
        if up:
            if h.started is not None:
                log.warning("%s is ready again after its restart", replica.describe())
                h.started = None
            h.up_since = h.up_since or now
            if h.attempts and now - h.up_since >= STABLE:
                h.attempts = 0
        else:
            h.up_since = None
            if h.started is not None and now - h.started > self.ready_timeout:
                log.error("%s was not ready %.0f s after its restart: killing it", replica.describe(),
                          self.ready_timeout)
                _signal_group(replica.process, signal.SIGKILL)      # the next round sees it exited

    def _give_up(self, i: int) -> None:
        self.state[i].failed = True
        log.error("%s exited %d times in a row: no more restarts; it stays out of rotation",
                  self.replicas[i].describe(), self.max_restarts + 1)
        if all(h.failed for h in self.state) and self.on_all_failed is not None:
            log.error("every replica has failed: the front gives up (exit status 1)")
            self.on_all_failed()
