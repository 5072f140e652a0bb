"""The limits of one grading sandbox (`sandbox.py`): a cgroup (v1 memory + pids) when this machine
lets us make one, else rlimits; CPU time always an rlimit. A sandbox whose memory limit killed a
process is ended whole (what waited on that process would wait out the timeout)."""
from __future__ import annotations

import os
import resource
import secrets
import signal
import subprocess
import threading
from pathlib import Path


class Cgroup:
    """A v1 memory + pids cgroup for one sandbox, when this machine lets us make one."""

    def __init__(self, memory: int, processes: int):
        self.paths = []
        name = f"minillm-grade-{secrets.token_hex(6)}"
        for controller, settings in (("memory", {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}),
                                     ("pids", {"pids.max": processes})):
            path = Path("/sys/fs/cgroup") / controller / name
            try:
                path.mkdir()
                self.paths.append(path)
                for key, value in settings.items():
                    if (path / key).exists():
                        (path / key).write_text(str(value))
            except OSError:
                continue

    def join(self) -> None:                          # in the child, before exec
        for path in self.paths:
            try:
                (path / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass

    def memory_hit(self) -> bool:
        for path in self.paths:
            control = path / "memory.oom_control"
            fields = dict(line.split() for line in control.read_text().splitlines()) if control.exists() else {}
            if int(fields.get("oom_kill", 0)) > 0 or int(fields.get("under_oom", 0)) > 0:
                return True
            failcnt = path / "memory.memsw.failcnt"
            if failcnt.exists() and int(failcnt.read_text() or 0) > 0:
                return True
        return False

    def kill(self) -> None:
        for path in self.paths:
            try:
                pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def close(self) -> None:
        for path in self.paths:
            for _ in range(50):
                self.kill()
                try:
                    path.rmdir()
                    break
                except OSError:
                    threading.Event().wait(0.05)


def limits(cpu_seconds: int, cgroup: Cgroup, memory: int):
    def apply():
        cgroup.join()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if not cgroup.paths:                          # no cgroup here: cap each process's address space
            resource.setrlimit(resource.RLIMIT_AS, (memory * 2, memory * 2))
    return apply


def watch(proc: subprocess.Popen, cgroup: Cgroup) -> None:
    """Once the memory limit killed one process (a kernel), end the whole sandbox: what waited on
    it (nbval, the judge) would otherwise wait out the timeout."""
    while proc.poll() is None:
        if cgroup.memory_hit():
            cgroup.kill()
            return
        threading.Event().wait(0.25)


def sweep(older_than: float = 600) -> None:
    """Remove the empty cgroups a killed grader left behind (a live sandbox's cgroup is not empty,
    and one made moments ago may not be joined yet: only old ones go)."""
    import time
    for controller in ("memory", "pids"):
        for path in Path("/sys/fs/cgroup", controller).glob("minillm-grade-*"):
            try:
                if time.time() - path.stat().st_mtime > older_than:
                    path.rmdir()
            except OSError:
                continue
