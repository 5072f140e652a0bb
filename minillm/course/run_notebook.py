"""Run one notebook under pytest + nbval (lax) in a process of its own, with a timeout.

The grader (`grade.py`) needs two things nbval alone does not give: a hard limit on a
notebook that never ends (the pytest process, its kernel and their children are killed),
and which cell was running when time ran out. A small pytest plugin
(`minillm.course._record`, loaded from a copy beside the notebook) writes each cell's start
and end to a file as it happens, so even a killed run leaves its record.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from . import sandbox


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    """The pytest process, its kernel (which jupyter starts in a session of its own) and theirs."""
    for pid in [proc.pid] + _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run_notebook(nb, timeout: float, env_path: str | None = None) -> tuple[dict[int, dict], int | None, str, bool]:
    """Run `nb` under pytest + nbval (lax) in a process of its own. Returns (code cell index
    -> its end record, the cell running when time ran out, pytest's output, timed out)."""
    work = Path(tempfile.mkdtemp(prefix="minillm-grade-"))
    try:
        path = work / "submission.ipynb"
        nbformat.write(nb, str(path))
        (work / "pytest.ini").write_text("[pytest]\n")
        record = work / "record.jsonl"
        # only the two plugins grading needs: autoloading every installed one (hypothesis, anyio,
        # xdist, ...) costs each notebook about two seconds of CPU
        env = dict(os.environ, MINILLM_GRADE_RECORD=str(record), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        env.setdefault("OMP_NUM_THREADS", "1")
        if env_path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [env_path, env.get("PYTHONPATH")]))
        # the recording plugin, copied beside the notebook (the run's folder is on its sys.path) and
        # loaded by that name: as minillm.course._record it would import the package, torch included
        shutil.copyfile(Path(__file__).with_name("_record.py"), work / "minillm_grade_record.py")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "minillm_grade_record", "-p", "nbval",
               "-c", str(work / "pytest.ini"), "--rootdir", str(work), "--nbval-lax", "--nbval-current-env",
               f"--nbval-cell-timeout={max(1, int(timeout))}", str(path)]
        # in the grading sandbox (sandbox.py) when one was chosen: this folder its only writable one
        proc = sandbox.popen(cmd, cwd=work, env=env, timeout=timeout, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc)
            output = proc.stdout.read() if proc.stdout else ""
        sandbox.finish(proc, timed_out)
        ends, running = {}, None
        if record.exists():
            for line in record.read_text(encoding="utf-8").splitlines():
                event = json.loads(line)
                if event["event"] == "start":
                    running = event["cell"]
                else:
                    ends[event["cell"]] = event
                    running = None
        if any(e.get("error") == "Timeout" for e in ends.values()):
            timed_out = True
        return ends, running, output, timed_out
    finally:
        shutil.rmtree(work, ignore_errors=True)


