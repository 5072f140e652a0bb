"""`python -m minillm serve --data-parallel-size N [--replica-url URL ...]`: N replicas (and
any given by URL, remote.py) behind one routing front.

In order: check the flags (a bad engine option fails here, before any replica starts) and
take the front's port (a port in use fails here too, not after minutes of loading), start
the replicas and wait until each answers, then serve the front until SIGTERM or SIGINT; on
the way out, whatever happened, stop every replica (replicas.py).

Shutdown keeps a single server's contract: the front's first signal goes on to the replicas
at once, so each gives its requests in flight the same --shutdown-timeout and then ends the
rest with an error in OpenAI's shape, which the front relays while it drains its own.
Meanwhile a replica that exits is started again (healing.py, up to --max-replica-restarts in a
row), and one silent for --replica-timeout seconds has its requests ended (health.py); when
every replica has failed for good, the front shuts down and exits 1. The replicas' logs go
to one temporary directory, removed with them. Replicas given by URL are checked at startup
(remote.py) and never signalled, stopped or restarted: the front did not start them.
"""
from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

from ...cli.engine_args import engine_config_from_args
from ...lora.adapter import read_adapter_config
from ...models.embedded import EMBEDDED_NAME
from ..lora_models import parse_lora_modules
from ..run import Server, Timeouts
from .app import build_front_app
from .remote import check_served_models, replica_url, url_replicas
from .replicas import READY_TIMEOUT, Launcher, signal_replicas, stop_replicas, wait_ready
from .router import Router


def main(args) -> int:
    n, urls = args.data_parallel_size, [replica_url(u) for u in args.replica_url or []]
    if args.replica_timeout <= 0 or args.max_replica_restarts < 0:
        raise ValueError("--replica-timeout must be > 0 and --max-replica-restarts >= 0")
    engine_config_from_args(args)                       # validates the engine flags the replicas get
    adapters = parse_lora_modules(args.lora_modules)
    for name, path in adapters:                         # a bad folder fails here, not in N replicas' logs
        try:
            read_adapter_config(Path(path))
        except ValueError as e:
            raise ValueError(f"--lora-modules {name}={path}: {e}") from None
    timeouts = Timeouts(args.shutdown_timeout, args.header_timeout, args.timeout_keep_alive)
    router = Router(n + len(urls), args.router_policy or "cache-aware", args.router_load_bound)
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as e:                                # e.g. the port is taken
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"starting {n} replicas" + (f", with {len(urls)} given by URL" if urls else "")
          + f" ({router.policy} routing)...", flush=True)
    launcher, replicas = Launcher(args, n), []
    try:
        try:
            for i in range(n):
                replicas.append(launcher.start(i))
            replicas += url_replicas(urls, n)
            for r in replicas[n:]:
                print(f"  waiting for {r.describe()} to answer /health", flush=True)
            wait_ready(replicas, READY_TIMEOUT)
            check_served_models(replicas[n:], args.served_model_name or args.model or EMBEDDED_NAME,
                                [name for name, _ in adapters], args.api_key)
        except (RuntimeError, TimeoutError) as e:       # a replica failed to start: its log says why
            print(f"error: {e}", file=sys.stderr)
            return 1
        for r in replicas:
            print(f"  {r.describe()}, " + ("checked like the others, never restarted by this front (it did not "
                                           "start it)" if r.external else f"log {r.log}"), flush=True)
        app = build_front_app(replicas, router, api_key=args.api_key, body_timeout=args.body_timeout,
                              max_request_body_bytes=args.max_request_body_bytes,
                              replica_timeout=args.replica_timeout, max_restarts=args.max_replica_restarts,
                              on_all_failed=lambda: front.give_up(), launcher=launcher)
        front = FrontServer(app, sock, timeouts=timeouts)
        front.replicas = replicas
        front.run()
    finally:                                            # (a front killed outright: lifeline.py)
        sock.close()
        stop_replicas(replicas, timeout=args.shutdown_timeout + 10)
        launcher.remove_logs()
    return front.exit_code


class FrontServer(Server):
    replicas: list = []
    exit_code = 0

    def begin_shutdown(self) -> None:
        super().begin_shutdown()
        signal_replicas(self.replicas, signal.SIGTERM)     # they drain alongside the front

    def give_up(self) -> None:
        """Every replica failed for good: stop, and exit 1 so that the orchestrator restarts us."""
        self.exit_code = 1
        if not self.should_exit:
            self.begin_shutdown()
