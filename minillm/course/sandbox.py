"""Where a student's code runs while it is graded: a bubblewrap sandbox per process tree.

Grading runs untrusted code. Inside the sandbox (`bwrap`, unprivileged namespaces) a student's
notebook sees: the system and the Python install, read-only; the package, read-only, where it is installed (a
copy with the answers withheld where the graders are not inside, `withheld.py`, in its place);
its own writable working folder (only that notebook's files) and a private /tmp. It does not see
the submissions folder, other students, the hidden checks, the grades being written or the
checkout the package was installed from (editable installs included), and it has no network.
Every process it starts lives in its own pid namespace, so all of them die with the sandbox
(a double-forked daemon included); memory, process count and CPU time are capped (a cgroup when
this machine lets us make one, else rlimits).

`--sandbox auto` uses bubblewrap when it works here (probed once), else `none`, which runs the
student's code as the grader's own user, unconfined, and says so loudly (`WARNING`).
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .limits import Cgroup, limits, sweep, watch

KINDS = ("auto", "bwrap", "none")
PACKAGE_DIR = Path(__file__).resolve().parents[1]          # the real minillm/ (editable or installed)
INSIDE_PKG = str(PACKAGE_DIR.parent)     # the package's view is bound where the package is (same paths, same
                                         # kernel cache keys), over it: the real one is not seen
INSIDE_CACHE = "/sandbox/cache"                            # the converted model, compiled kernels (read-only)
WARNING = ("WARNING: graded with --sandbox none: student code ran as your own user with your files, "
           "network and processes in reach (answers, hidden checks, other students, the grade files); "
           "grade untrusted notebooks with bubblewrap installed (apt-get install bubblewrap)")
MEMORY = int(os.environ.get("MINILLM_GRADE_MEMORY", 6 << 30))     # bytes per sandbox
PROCESSES = 256                                                    # tasks (threads too) per sandbox
_state = {"kind": None, "probe": None}
_local = threading.local()


class SandboxError(RuntimeError):
    """The sandbox asked for cannot run on this machine."""


# ---------------------------------------------------------------- choosing one

def _binds() -> list[str]:
    """bwrap arguments: the system and the Python install, read-only, the real package hidden."""
    args = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt"):
        if os.path.exists(top):
            args += ["--ro-bind", top, top]
    for prefix in dict.fromkeys(map(os.path.realpath, (sys.base_prefix, sys.prefix))):
        args += ["--ro-bind", prefix, prefix]
    for link in dict.fromkeys((sys.prefix, sys.base_prefix)):       # a venv reached through a symlink
        if os.path.realpath(link) != link:
            args += ["--symlink", os.path.realpath(link), link]
    return args


def _bwrap_base(writable: list[str]) -> list[str]:
    args = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", "1000", "--gid", "1000", "--hostname", "sandbox"]
    # the private /tmp first: bwrap mounts in order, so a Python install under /tmp (a clone there,
    # its .venv) is bound over it and stays visible, instead of being hidden by it
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"] + _binds() + ["--dir", "/sandbox"]
    for path in writable:
        args += ["--bind", path, path]
    return args


def probe() -> str | None:
    """None when bubblewrap runs here (tried once per process), else why not."""
    if _state["probe"] is None:
        if shutil.which("bwrap") is None:
            _state["probe"] = "bwrap is not installed (apt-get install bubblewrap)"
        else:
            try:
                run = subprocess.run(_bwrap_base([]) + [sys.executable, "-c", "print('ok')"], capture_output=True,
                                     text=True, timeout=60)
                ok = run.returncode == 0 and run.stdout.strip() == "ok"
                _state["probe"] = "" if ok else f"bwrap cannot start here: {run.stderr.strip()[-300:]}"
            except (OSError, subprocess.TimeoutExpired) as e:
                _state["probe"] = f"bwrap cannot start here: {e}"
    return _state["probe"] or None


def configure(kind: str) -> str:
    """Choose the sandbox for this grading run (auto: bwrap when it works here, else none)."""
    if kind not in KINDS:
        raise SandboxError(f"--sandbox {kind}: choose one of {', '.join(KINDS)}")
    if kind == "auto":
        kind = "none" if probe() else "bwrap"
    elif kind == "bwrap" and probe():
        raise SandboxError(f"--sandbox bwrap: {probe()}")
    use(kind)
    if kind != "none":
        sweep()
    if kind != "none" and not os.environ.get("MINILLM_GRADE_WITHHELD"):
        shared = tempfile.mkdtemp(prefix="minillm-withheld-")     # the answer-withheld copies, for every judge
        atexit.register(shutil.rmtree, shared, True)
        os.environ["MINILLM_GRADE_WITHHELD"] = shared
    os.environ["MINILLM_GRADE_SANDBOX"] = kind
    return kind


def use(kind: str) -> None:
    """Take `kind` as chosen (a judge process started by a grader that already probed)."""
    _state["kind"] = kind


def current() -> str:
    return _state["kind"] or "none"


def failures() -> list[str]:
    """The sandbox failures (timeout, memory, killed) of the processes this thread ran, since the last call."""
    out = getattr(_local, "failures", [])
    _local.failures = []
    return out


def _note(failure: str) -> None:
    if not hasattr(_local, "failures"):
        _local.failures = []
    _local.failures.append(failure)


# ---------------------------------------------------------------- one sandboxed process tree

def environment(extra: dict[str, str], package: str | None = None) -> dict[str, str]:
    """A clean environment for the sandbox: nothing of the grader's own (tokens, paths) but what Python needs."""
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
           "LANG": "C.UTF-8", "PYTHONPATH": INSIDE_PKG, "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           "MPLCONFIGDIR": "/tmp/mpl", "TRITON_CACHE_DIR": "/tmp/triton", "MINILLM_CACHE": INSIDE_CACHE,
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for key in ("MINILLM_NO_CPP_OPS", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra)
    return env


def popen(cmd: list[str], *, cwd, env: dict[str, str], package: Path | None = None, timeout: float = 600,
          **kwargs) -> subprocess.Popen:
    """Start `cmd` in a new sandbox (or, with --sandbox none, as it is) with `cwd` its one writable
    folder. Call `finish(proc)` once it has ended (or been killed)."""
    kind = current()
    if kind == "none":
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True, **kwargs)
        proc.box = None
        return proc
    from ..utils.paths import cache_dir
    cgroup = Cgroup(MEMORY, PROCESSES)
    inside_env = environment({k: v for k, v in env.items() if k.startswith(("MINILLM_GRADE", "PYTEST_"))})
    args = _bwrap_base([str(cwd)])
    args += ["--ro-bind", str(package or PACKAGE_DIR), str(PACKAGE_DIR)]
    if cache_dir().is_dir():
        args += ["--ro-bind", str(cache_dir()), INSIDE_CACHE]
    args += ["--chdir", str(cwd), "--clearenv"]
    for key, value in inside_env.items():
        args += ["--setenv", key, value]
    kwargs.pop("start_new_session", None)
    proc = subprocess.Popen(args + cmd, cwd=cwd, start_new_session=True,
                            preexec_fn=limits(int(timeout * 2) + 60, cgroup, MEMORY), **kwargs)
    proc.box = cgroup
    if cgroup.paths:
        threading.Thread(target=watch, args=(proc, cgroup), daemon=True).start()
    return proc


def finish(proc: subprocess.Popen, timed_out: bool = False) -> str | None:
    """Kill whatever of the sandbox is left and say how it ended, when that was a failure
    (timeout, memory, killed by a signal), also noted for `failures()`."""
    box = getattr(proc, "box", None)
    try:
        proc.wait(timeout=0 if timed_out else 2)          # one that is ending on its own ends as it does
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    failure = None
    if box is not None:
        if box.memory_hit():
            failure = f"memory: the sandbox ran out of its {MEMORY >> 20} MiB and was killed"
        box.close()
    if failure is None and timed_out:
        failure = "timeout: the sandbox ran past its time and was killed"
    elif failure is None and proc.returncode is not None and proc.returncode < 0:
        failure = f"killed: the sandbox's process ended by signal {-proc.returncode}"
    if failure:
        _note(failure)
    return failure


def workdir(prefix: str) -> Path:
    """A fresh folder for one sandbox (the only one it may write)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


# ---------------------------------------------------------------- the grader's output

def report(table: str, failed: list[tuple[str, str, str]]) -> str:
    """The table, a line for each sandbox failure, and the warning when nothing was confined."""
    lines = [table]
    if failed:
        lines += ["", "sandbox failures:"] + [f"  {student} {lesson}: {what}" for student, lesson, what in failed]
    if current() == "none":
        lines = [WARNING, ""] + lines + ["", WARNING]
    return "\n".join(lines)


def marked(records: list) -> list:
    """The records as grades.json holds them: each says the sandbox it was graded in (and, with
    none, the warning)."""
    from dataclasses import asdict, dataclass

    from .report import Record

    @dataclass
    class Graded(Record):
        sandbox: str
        warning: str

    kind = current()
    return [Graded(**asdict(r), sandbox=kind, warning=WARNING if kind == "none" else "") for r in records]


def write_atomically(path, write) -> None:
    """`write(temporary path)` then a rename onto `path`: a reader sees the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent.resolve()))
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
