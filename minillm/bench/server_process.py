"""Start an HTTP server as a child process, wait until it answers, stop it by its process id.

The serving benchmark runs each server in its own process (ours and transformers'), one at a
time, so the two never share the CPU and a crash in one cannot take the benchmark down.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from ..utils.ports import free_port     # (re-exported: the benches and tests take it from here)


def minillm_command(model: str | None, port: int, engine_flags: list[str] = ()) -> list[str]:
    """`minillm serve` on `port`; engine_flags: e.g. ["--max-num-seqs", "32"] (cli/engine_args.engine_argv)."""
    return ([sys.executable, "-m", "minillm", "serve", "--port", str(port)] + (["--model", model] if model else [])
            + list(engine_flags))


def transformers_command(folder: str, port: int) -> list[str]:
    """transformers' own OpenAI server on the same checkpoint, with its continuous batching."""
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    return [exe, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port), folder]


class ServerProcess:
    """`with ServerProcess(command, port) as server:` ... `server.url` ... (stopped on exit)."""

    def __init__(self, command: list[str], port: int, log: str | None = None,
                 ready_timeout: float = 600.0):
        self.port, self.command = port, command
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, self.ready_timeout = log, ready_timeout
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        out = open(self.log, "w") if self.log else subprocess.DEVNULL
        self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command[0]} exited with {self.process.returncode} before it was ready"
                                   + (f"; see {self.log}" if self.log else ""))
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise TimeoutError(f"{' '.join(self.command)} was not ready after {self.ready_timeout:.0f} s")

    def __exit__(self, *exc) -> bool:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)         # its whole process group, by id
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return False
