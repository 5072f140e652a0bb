"""Run an app with uvicorn: in the foreground (the CLI), or in a background thread
(tests, and a notebook that serves and queries in the same kernel).

We bind the socket ourselves, so `port=0` picks a free port and we know which one, and
we print the URL only once uvicorn has started and accepts connections.

Shutdown has a deadline, as orchestrators expect (they send SIGTERM, wait a grace period,
then SIGKILL): the first SIGTERM or SIGINT stops accepting connections and lets requests in
flight finish for `shutdown_timeout` seconds; then the rest end with an error in OpenAI's
shape (an error event in a stream), one log line each, and the process exits 0. A second
signal exits at once, without tracebacks. An engine that can never serve again (async_engine.py)
shuts the server down the same way, and `python -m minillm serve` then exits 1.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn

from .errors import APIError
from .health import quiet_probes_in_access_log
from .slow_clients import DEFAULT_HEADER_TIMEOUT, protocol_with_header_timeout

log = logging.getLogger("minillm.server")


@dataclass
class Timeouts:
    shutdown: float = 5.0                  # seconds in-flight requests get after the first signal
    header: float = DEFAULT_HEADER_TIMEOUT  # seconds for a request's headers (slow_clients.py)
    keep_alive: float = 5.0                # an idle keep-alive connection is closed after this


class Server(uvicorn.Server):
    def __init__(self, app, sock: socket.socket, announce: bool = True, timeouts: Timeouts | None = None):
        self.timeouts = timeouts = timeouts or Timeouts()
        super().__init__(uvicorn.Config(app, log_level="info" if announce else "warning",
                                        http=protocol_with_header_timeout(timeouts.header),
                                        timeout_keep_alive=timeouts.keep_alive,
                                        timeout_graceful_shutdown=timeouts.shutdown + 2))
        host, port = sock.getsockname()[:2]
        self.sock, self.announce = sock, announce
        self.url = f"http://{host}:{port}"
        quiet_probes_in_access_log()
        served = getattr(getattr(app, "state", None), "served", None)
        if served is not None:                       # the engine gave up: stop serving (the CLI exits 1)
            served.front.on_fatal = lambda reason: self.begin_shutdown()

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started and self.announce:
            print(f"minillm serving on {self.url}  (OpenAI API at {self.url}/v1)", flush=True)

    def run(self, sockets=None):
        super().run(sockets=[self.sock])

    @contextlib.contextmanager
    def capture_signals(self):
        """Our handlers for SIGINT/SIGTERM while serving; unlike uvicorn's, the signal is not raised
        again afterwards: a shutdown that finished within its deadline exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:                         # a second signal: now
            sys.stderr.write("minillm: second signal, exiting now\n")
            sys.stderr.flush()
            os._exit(1)
        self.begin_shutdown()

    def begin_shutdown(self) -> None:
        """Stop accepting; after the deadline, end what is still running (module doc)."""
        self.should_exit = True
        deadline = self.timeouts.shutdown
        log.warning("shutting down: requests in flight have %.1f s to finish", deadline)
        threading.Thread(target=self._end_the_rest, args=(deadline,), daemon=True,
                         name="minillm-shutdown-deadline").start()

    def _end_the_rest(self, deadline: float) -> None:
        time.sleep(deadline)
        served = getattr(getattr(self.config.app, "state", None), "served", None)
        if served is not None:
            served.front.end_all(APIError(503, f"the server is shutting down: the request did not finish "
                                               f"within the {deadline:g} s shutdown deadline", code="server_shutdown"))


def serve(app, host: str = "127.0.0.1", port: int = 8000, timeouts: Timeouts | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down within the deadline (module doc)."""
    Server(app, socket.create_server((host, port)), timeouts=timeouts).run()


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 60.0,
                    timeouts: Timeouts | None = None) -> Server:
    """Start serving in a daemon thread; returns once it accepts requests. Stop with
    `stop_server(server)`."""
    server = Server(app, socket.create_server((host, port)), announce=False, timeouts=timeouts)
    server.thread = threading.Thread(target=server.run, name="minillm-uvicorn", daemon=True)
    server.thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not server.thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    return server


def stop_server(server: Server, timeout: float = 30.0) -> None:
    server.should_exit = True
    server.thread.join(timeout)
