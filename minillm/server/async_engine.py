"""The async front of the engine (vLLM's AsyncLLMEngine): many clients, one engine.

The engine is not thread-safe and `step()` is blocking work (10-200 ms of matmuls), so:
  - exactly one thread, the engine loop, ever calls into the engine. It steps while there
    is work and sleeps on an event when there is none;
  - the asyncio side (the HTTP handlers) never touches the engine: it sends commands
    ("add these prompts", "abort these requests") through a thread-safe queue and wakes
    the loop;
  - each HTTP request's outputs come back on its own asyncio.Queue, filled from the loop
    thread with `loop.call_soon_threadsafe` (an asyncio.Queue is not thread-safe itself).

    handler ──add/abort──► command queue ──► engine loop thread: add_request / step()
    handler ◄──outputs─── RequestStream.queue ◄── call_soon_threadsafe ◄──┘

A new request joins the running batch at the next step (continuous batching). A client
that goes away aborts its requests, and their KV blocks are free for the next step.

The loop also watches the engine (health.py says what each state means to a probe): a
tensor-parallel rank that died, seen within WATCH_INTERVAL_S even while idle, ends every request
in flight with the error, and the group is started again (distributed/recovery.py); meanwhile
`failure` says why the engine cannot serve and new requests get a 503 with Retry-After. If it
cannot be started again, or the loop itself dies, `on_fatal` is called: the server exits
non-zero, so that an orchestrator starts a new one (a multi-node group's head stays up: `lost`).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading

from ..distributed.recovery import (RESTART_ATTEMPTS, RESTART_BACKOFF_S, RestartFailed, can_restart, lost_group,
                                    restart_runner, runner_failure)
from .errors import APIError
from .limits import default_max_waiting_requests

log = logging.getLogger("minillm.server")

WATCH_INTERVAL_S = 0.5       # an idle loop looks at the engine's processes this often
RETRY_AFTER_S = 5            # what a 503 tells a client to wait while the engine restarts


class QueueFull(Exception):
    """The waiting queue holds max_waiting_requests already: try again later (HTTP 503)."""


class RequestStream:
    """One HTTP request's engine requests (one per prompt) and the queue their outputs
    arrive on. Iterate it for (prompt index, RequestOutput) until every request finished;
    `abort()` (or leaving `async with`) cancels what is still running."""

    def __init__(self, front: "AsyncEngine", request_ids: list[str], prompts: list, params: list,
                 priority: int):
        self.front, self.request_ids = front, request_ids
        self.prompts, self.params, self.priority = prompts, params, priority
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.unfinished = set(request_ids)
        self.index = {rid: i for i, rid in enumerate(request_ids)}

    def deliver(self, item) -> None:
        """Called from the engine thread: hand an item to the event loop's queue."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:          # the event loop is closed: nobody is listening any more
            pass

    def __aiter__(self):
        return self._outputs()

    async def _outputs(self):
        """Yield (prompt index, RequestOutput) as the engine delivers them, until every request
        finished (its finished output included); raise the engine's failure."""
        while self.unfinished:
            kind, value = await self.queue.get()
            if kind == "closed":
                return
            if kind == "failed":
                raise value
            if value.finished:
                self.unfinished.discard(value.request_id)
            yield self.index[value.request_id], value

    def abort(self) -> None:
        """Stop whatever is unfinished (the client went away); iteration ends."""
        if self.unfinished:
            self.front.send(("abort", list(self.unfinished)))
            self.unfinished.clear()
            self.queue.put_nowait(("closed", None))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.abort()


class AsyncEngine:
    """`stream_cls`: the class of each HTTP request's stream, RequestStream or a subclass
    (lesson 07 plugs the learner's in here, through `build_app(..., stream_cls=...)`)."""

    restart_attempts, restart_backoff = RESTART_ATTEMPTS, RESTART_BACKOFF_S     # distributed/recovery.py

    def __init__(self, engine, max_waiting_requests: int | None = None, stream_cls: type = RequestStream):
        """max_waiting_requests: sequences that may wait at once (a request's prompts x n count);
        None: limits.default_max_waiting_requests, sized from the KV pool."""
        self.engine = engine                      # touched by the loop thread only
        self.max_model_len = engine.max_model_len  # constant: safe to read anywhere
        self.max_waiting_requests = (default_max_waiting_requests(engine) if max_waiting_requests is None
                                     else max_waiting_requests)
        self.stream_cls = stream_cls
        self.snapshot: dict = {}                  # the engine's gauges after the latest step
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}     # request id -> its stream (loop thread)
        self._thread: threading.Thread | None = None
        self._running = False
        self.failure: str | None = None           # why the engine cannot serve now (None: it can)
        self.fatal = False                        # ... and never will again: the server exits
        self.lost: dict | None = None             # ... a multi-node group's failed nodes and the next step
        self.restarts = 0                         # tensor-parallel groups started again
        self.on_fatal = None                      # called once (loop thread) when fatal: run.py stops the server

    # -- the asyncio side --------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        self._take_snapshot()
        self._thread = threading.Thread(target=self._loop, name="minillm-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def unavailable(self) -> str | None:
        """Why a request cannot be served now (the engine restarts, or is gone), or None."""
        if self.failure is not None:
            return self.failure
        if not self.is_alive:
            return "the engine loop is not running"
        return None

    def end_all(self, error: Exception) -> None:
        """End every request in flight with `error` (the shutdown deadline passed); each
        stream reports it to its client. Thread-safe: the loop thread does the work."""
        self.send(("end_all", error))

    def send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    async def add(self, request_ids: list[str], prompts: list, params: list, priority: int = 0,
                  lora_request=None) -> RequestStream:
        """Queue one engine request per prompt; all are accepted, or none is. Raises what
        `add_request` raised (ValueError / TypeError: the client's mistake) or QueueFull,
        before any output exists, so the handler can still answer with an error status."""
        why = self.unavailable()
        if why is not None:
            raise APIError(503, f"the engine cannot serve now: {why}", code="engine_unavailable",
                           headers=None if self.fatal else {"Retry-After": str(RETRY_AFTER_S)})
        stream = self.stream_cls(self, request_ids, prompts, params, priority)
        stream.lora_request = lora_request            # its LoRA adapter (server/lora_models.py), None: the base
        self.send(("add", stream))
        try:
            kind, error = await stream.queue.get()
        except asyncio.CancelledError:      # the client left while we waited: undo the add
            stream.abort()
            raise
        if kind != "accepted":
            raise error
        return stream

    # -- the engine loop thread --------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._running:
                try:
                    self._run_commands()
                    if self.engine.has_unfinished_requests():
                        self._step()
                    else:
                        self._take_snapshot()
                        self._wake.wait(WATCH_INTERVAL_S)   # idle: sleep until a command arrives
                        self._wake.clear()
                    self._watch()
                except Exception as e:          # the engine fails requests itself; this is a bug
                    log.exception("the engine loop failed; failing every request in flight")
                    self._fail_all(e)
        except BaseException as e:              # the loop is gone: nothing will serve a request again
            self._give_up(f"the engine loop died: {e!r}", traceback=True)
            return
        self._fail_all(APIError(503, "the server is shutting down", code="server_shutdown"))
        self.engine.shutdown()

    def _watch(self) -> None:
        """A dead tensor-parallel rank: end what is in flight, start the group again (module doc)."""
        failure = runner_failure(self.engine)
        if failure is None:
            return
        lost = lost_group(self.engine, failure)          # across nodes: the head stays up (recovery.py)
        if lost or not can_restart(self.engine):
            return self._give_up(failure, lost=lost)
        log.error("the engine cannot serve: %s; starting the tensor-parallel group again", failure)
        self.failure = f"the tensor-parallel group is restarting after: {failure}"
        self._fail_all(APIError(503, f"the engine failed: {failure}", code="engine_restarting"))
        try:
            attempts = restart_runner(self.engine, self.restart_attempts, self.restart_backoff)
        except RestartFailed as e:
            return self._give_up(str(e))
        self.restarts += 1
        self.failure = None
        self._take_snapshot()
        log.warning("the tensor-parallel group serves again (restart %d, %d attempt(s))", self.restarts, attempts)

    def _give_up(self, reason: str, traceback: bool = False, lost: dict | None = None) -> None:
        """The engine can never serve again: say why once, loudly, end every request, and let
        the server exit non-zero (on_fatal) rather than answer every request with an error; or,
        given `lost` (a multi-node group failed), stay up answering why, for the operator."""
        if self.fatal:
            return
        self.failure, self.fatal, self._running, self.lost = reason, True, lost is not None, lost
        log.error("the engine cannot serve and cannot be restarted: %s; %s", reason,
                  lost["action"] if lost else "the server stops (exit code 1)", exc_info=traceback)
        try:
            self._fail_all(APIError(503, f"the engine stopped: {reason}", code="engine_dead"))
        finally:
            if self.on_fatal is not None and lost is None:
                self.on_fatal(reason)

    def _fail_all(self, error: Exception) -> None:
        for rid, stream in list(self._streams.items()):
            self.engine.abort_request(rid)
            stream.deliver(("failed", error))
        self._streams.clear()

    def _run_commands(self) -> None:
        while True:
            try:
                command, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if command == "add":
                self._add(arg)
            elif command == "end_all":
                for rid in self._streams:
                    log.warning("request %s ended: %s", rid, arg)
                self._fail_all(arg)
            else:
                for rid in arg:
                    self._streams.pop(rid, None)
                    self.engine.abort_request(rid)

    def _add(self, stream: RequestStream) -> None:
        limit, waiting = self.max_waiting_requests, len(self.engine.scheduler.waiting)
        asked = sum(p.n for p in stream.params)
        if asked > limit:                   # never admitted, however long it waits: the client's mistake (400)
            n = stream.params[0].n
            error = ValueError(f"this request adds {asked} sequences ({len(stream.params)} prompt(s) x n={n}); "
                               f"at most {limit} may wait (max_waiting_requests): it could never be admitted")
            error.param = "n" if n > 1 else "prompt"
            stream.deliver(("rejected", error))
            return
        if waiting + asked > limit:
            stream.deliver(("rejected", QueueFull(f"{waiting} sequences are waiting already and this request "
                                                  f"adds {asked} (max_waiting_requests={limit}); retry later")))
            return
        added = []
        try:
            for rid, prompt, params in zip(stream.request_ids, stream.prompts, stream.params):
                self.engine.add_request(rid, prompt, params, stream.priority, getattr(stream, "lora_request", None))
                added.append(rid)
        except Exception as e:              # ValueError/TypeError: a bad request; else our bug
            for rid in added:
                self.engine.abort_request(rid)
            stream.deliver(("rejected", e))
            return
        for rid in added:
            self._streams[rid] = stream
        stream.deliver(("accepted", None))

    def _step(self) -> None:
        for out in self.engine.step():
            stream = self._streams.get(out.request_id)
            if stream is None:              # aborted meanwhile
                continue
            if out.finished:
                del self._streams[out.request_id]
            stream.deliver(("output", out))
        self._take_snapshot()

    def _take_snapshot(self) -> None:
        s = self.engine.scheduler
        self.snapshot = dict(self.engine.stats(), num_running=len(s.running),
                             num_waiting=len(s.waiting), num_swapped=len(s.swapped))
