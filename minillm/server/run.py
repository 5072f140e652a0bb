"""Run an app with uvicorn: in the foreground (the CLI), or in a background thread
(tests, and a notebook that serves and queries in the same kernel).

We bind the socket ourselves, so `port=0` picks a free port and we know which one, and
we print the URL only once uvicorn has started and accepts connections.
"""
from __future__ import annotations

import socket
import threading
import time

import uvicorn


class Server(uvicorn.Server):
    def __init__(self, app, sock: socket.socket, announce: bool = True):
        super().__init__(uvicorn.Config(app, log_level="info" if announce else "warning"))
        host, port = sock.getsockname()[:2]
        self.sock, self.announce = sock, announce
        self.url = f"http://{host}:{port}"

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started and self.announce:
            print(f"minillm serving on {self.url}  (OpenAI API at {self.url}/v1)", flush=True)

    def run(self, sockets=None):
        super().run(sockets=[self.sock])


def serve(app, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until Ctrl-C (uvicorn shuts down cleanly, then re-raises the interrupt)."""
    try:
        Server(app, socket.create_server((host, port))).run()
    except KeyboardInterrupt:
        pass


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 60.0) -> Server:
    """Start serving in a daemon thread; returns once it accepts requests. Stop with
    `stop_server(server)`."""
    server = Server(app, socket.create_server((host, port)), announce=False)
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
