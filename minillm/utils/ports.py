"""A free TCP port on loopback, for what this package starts itself (servers, replicas, rank groups)."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port nobody listens on now (the OS picks it); another process may still take it before use."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
