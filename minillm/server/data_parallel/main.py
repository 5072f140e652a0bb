"""`python -m minillm serve --data-parallel-size N`: N replicas behind one routing front.

In order: check the flags (a bad engine option fails here, before any replica starts) and
take the front's port (a port in use fails here too, not after minutes of loading), start
the replicas and wait until each answers, then serve the front until SIGTERM or SIGINT; on
the way out, whatever happened, stop every replica (replicas.py).

Shutdown keeps a single server's contract: the front's first signal goes on to the replicas
at once, so each gives its requests in flight the same --shutdown-timeout and then ends the
rest with an error in OpenAI's shape, which the front relays while it drains its own.
"""
from __future__ import annotations

import signal
import socket
import sys

from ...cli.engine_args import engine_config_from_args
from ..run import Server, Timeouts
from .app import build_front_app
from .replicas import signal_replicas, start_replicas, stop_replicas
from .router import Router


def main(args) -> int:
    n = args.data_parallel_size
    engine_config_from_args(args)                       # validates the engine flags the replicas get
    timeouts = Timeouts(args.shutdown_timeout, args.header_timeout, args.timeout_keep_alive)
    router = Router(n, args.router_policy or "cache-aware", args.router_load_bound)
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as e:                                # e.g. the port is taken
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"starting {n} replicas ({router.policy} routing)...", flush=True)
    try:
        replicas = start_replicas(args, n)
    except (RuntimeError, TimeoutError) as e:           # a replica failed to start: its log says why
        sock.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        for r in replicas:
            print(f"  {r.describe()}, log {r.log}", flush=True)
        app = build_front_app(replicas, router, api_key=args.api_key, body_timeout=args.body_timeout,
                              max_request_body_bytes=args.max_request_body_bytes)
        front = FrontServer(app, sock, timeouts=timeouts)
        front.replicas = replicas
        front.run()
    finally:                                            # (a front killed outright: lifeline.py)
        stop_replicas(replicas, timeout=args.shutdown_timeout + 10)
    return 0


class FrontServer(Server):
    replicas: list = []

    def begin_shutdown(self) -> None:
        super().begin_shutdown()
        signal_replicas(self.replicas, signal.SIGTERM)     # they drain alongside the front
