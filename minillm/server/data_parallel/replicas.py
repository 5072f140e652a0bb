"""Start N replicas, each a plain `python -m minillm serve` on a free loopback port with the
front's engine flags, wait until every one answers /health, and stop them all.

Each replica is its own process with its own engine and KV pool (vLLM's data parallelism).
It runs in its own session, so a Ctrl-C in the terminal reaches the front only and the front
decides the order of shutdown; its stdin is a pipe from the front (lifeline.py), so it ends
when the front ends, even a front killed with SIGKILL. Its output goes to a log file (the
front prints where): N servers' access logs interleaved on one terminal would read as noise.
The logs of one front's replicas share a directory, removed when the replicas are stopped
(the front logs the end of a replica's log when it exits, so a crash's cause outlives it).
On CPU each replica gets cores / N threads (unless OMP_NUM_THREADS says otherwise); with
enough GPUs each gets its own (unless CUDA_VISIBLE_DEVICES says otherwise). A `Launcher`
remembers how replica i was started, so the front can start it again (healing.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import httpx

from ...cli.engine_args import engine_argv
from ...utils.ports import free_port
from ..chat_setup import chat_argv
from ..lora_models import parse_lora_modules
from .lifeline import LOG_VARIABLE

READY_TIMEOUT = 600.0          # seconds for every replica to load its model and answer /health
REPLICA_KEEP_ALIVE = 60.0      # replicas keep idle connections longer than the front's pool does


@dataclass
class Replica:
    index: int
    url: str
    process: subprocess.Popen | None = None     # None: a server someone else started (remote.py)
    log: str | None = None
    launcher: "Launcher | None" = field(default=None, repr=False)   # None: cannot be restarted
    exit_reported: bool = field(default=False, repr=False)
    terminated: bool = field(default=False, repr=False)     # sent SIGTERM: draining (a second one is "now")

    @property
    def external(self) -> bool:
        """Given by URL (remote.py): the front checks it but never starts or restarts it."""
        return self.launcher is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def describe(self) -> str:
        where = f", pid {self.pid}" if self.process else ", given by URL" if self.external else ""
        return f"replica {self.index} ({self.url}{where})"


def replica_argv(args, port: int, lora_modules: dict[str, str] | None = None) -> list[str]:
    """`minillm serve` for one replica: the front's model, engine and chat flags, server limits,
    and the LoRA adapters it serves now (`lora_modules`: those of --lora-modules, and loaded since)."""
    argv = [sys.executable, "-m", "minillm", "serve", "--port", str(port)] + engine_argv(args) + chat_argv(args)
    if lora_modules:                          # vLLM's JSON form: a name or path with '=' stays whole
        argv += ["--lora-modules"] + [json.dumps({"name": n, "path": p}) for n, p in lora_modules.items()]
    if args.model:
        argv += ["--model", args.model]
    if args.served_model_name:
        argv += ["--served-model-name", args.served_model_name]
    if args.max_waiting_requests is not None:
        argv += ["--max-waiting-requests", str(args.max_waiting_requests)]
    argv += ["--max-request-body-bytes", str(args.max_request_body_bytes),
             "--shutdown-timeout", str(args.shutdown_timeout), "--body-timeout", str(args.body_timeout),
             "--timeout-keep-alive", str(max(REPLICA_KEEP_ALIVE, args.timeout_keep_alive)), "--exit-with-parent"]
    return argv


def replica_env(index: int, n: int, api_key: str | None, gpus_per_replica: int = 1) -> dict:
    env = dict(os.environ)
    env.pop("MINILLM_API_KEY", None)
    if api_key:                              # in the environment, not the command line `ps` shows
        env["MINILLM_API_KEY"] = api_key
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    if "CUDA_VISIBLE_DEVICES" not in env and _gpu_count() >= n * gpus_per_replica:
        first = index * gpus_per_replica
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(first, first + gpus_per_replica))
    return env


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


class Launcher:
    """Starts replica i's process, the first time or again after it exited: the front's flags, a
    free port (a new one each time: the old one may be held by a dying process), its log file
    (appended to). Once `stopping`, it starts nothing: the front is shutting down."""

    def __init__(self, args, n: int, log_dir: str | None = None):
        self.args, self.n = args, n
        self.gpus = getattr(args, "tensor_parallel_size", None) or 1
        self.own_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="minillm-replicas-")
        self.stopping = False
        self.lora_modules = dict(parse_lora_modules(getattr(args, "lora_modules", None)))   # adapters.py updates it
        self.lock = threading.Lock()        # a restart (a worker thread) against a stop (signal_replicas)

    def start(self, i: int) -> Replica:
        replica = Replica(i, "", launcher=self, log=os.path.join(self.log_dir, f"replica-{i}.log"))
        self._spawn(replica)
        return replica

    def restart(self, replica: Replica) -> bool:
        """Start an exited replica again, in place (same index and log); False once stopping."""
        with self.lock:
            if self.stopping:
                return False
            if replica.process is not None and replica.process.stdin:
                replica.process.stdin.close()
            replica.exit_reported = replica.terminated = False
            self._spawn(replica)
        return True

    def argv(self, port: int) -> list[str]:
        return replica_argv(self.args, port, self.lora_modules)

    def env(self, index: int) -> dict:
        return {**replica_env(index, self.n, self.args.api_key, self.gpus),
                LOG_VARIABLE: os.path.join(self.log_dir, f"replica-{index}.log")}

    def _spawn(self, replica: Replica) -> None:
        port = free_port()
        with open(replica.log, "a") as out:
            out.write(f"--- minillm front: starting replica {replica.index} on port {port} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            out.flush()
            replica.process = subprocess.Popen(self.argv(port), stdin=subprocess.PIPE, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True,
                                               env=self.env(replica.index))
        replica.url = f"http://127.0.0.1:{port}"

    def remove_logs(self) -> None:
        if self.own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def start_replicas(args, n: int, log_dir: str | None = None, ready_timeout: float = READY_TIMEOUT) -> list[Replica]:
    """Start n replicas at once (their models load in parallel) and wait for all of them.
    Their logs go to `log_dir`, or to a temporary directory that `stop_replicas` removes."""
    launcher = Launcher(args, n, log_dir)
    replicas = []
    try:
        for i in range(n):
            replicas.append(launcher.start(i))
        wait_ready(replicas, ready_timeout)
    except BaseException:
        stop_replicas(replicas, timeout=5.0)
        launcher.remove_logs()
        raise
    return replicas


def wait_ready(replicas: list[Replica], timeout: float) -> None:
    deadline, waiting = time.monotonic() + timeout, list(replicas)
    while waiting:
        for r in list(waiting):
            if r.exited():
                raise RuntimeError(f"{r.describe()} exited with {r.process.returncode} before it was ready; "
                                   f"the end of its log ({r.log}):\n{log_tail(r.log)}")
            try:
                if httpx.get(f"{r.url}/health", timeout=2).status_code == 200:
                    waiting.remove(r)
            except httpx.HTTPError:
                pass
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"{', '.join(r.describe() for r in waiting)} not ready after {timeout:.0f} s")
        if waiting:
            time.sleep(0.25)


def stop_replicas(replicas: list[Replica], timeout: float = 30.0) -> None:
    """SIGTERM every replica's process group (the graceful shutdown), SIGKILL what is left
    after `timeout` seconds, and reap them all: no zombie, no orphan. Then remove their logs."""
    signal_replicas([r for r in replicas if not r.terminated], signal.SIGTERM)
    running = [r for r in replicas if r.process is not None and r.process.poll() is None]
    deadline = time.monotonic() + timeout
    for r in running:
        try:
            r.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(r.process, signal.SIGKILL)
            r.process.wait()
    for r in replicas:
        if r.process is not None:
            if r.process.stdin:
                r.process.stdin.close()
            r.process.poll()
    for launcher in {id(r.launcher): r.launcher for r in replicas if r.launcher}.values():
        launcher.remove_logs()


def signal_replicas(replicas: list[Replica], sig: int) -> None:
    """Signal each replica's process group; SIGTERM also tells its launcher to start nothing
    more (under its lock, so a restart under way is either done, and signalled, or not begun)."""
    for r in replicas:
        with r.launcher.lock if r.launcher else contextlib.nullcontext():
            if sig == signal.SIGTERM and r.launcher:
                r.launcher.stopping = True
            if r.process is not None and r.process.poll() is None:
                r.terminated = r.terminated or sig == signal.SIGTERM
                _signal_group(r.process, sig)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)        # the replica and anything it started (its session, by id)
    except ProcessLookupError:
        pass


def log_tail(path: str | None, chars: int = 3000) -> str:
    if not path or not os.path.exists(path):
        return "(no log)"
    with open(path, errors="replace") as f:
        return f.read()[-chars:]
