"""What a few graders need, besides proxies of the student's objects, to run outside the sandbox
(`judge.py`).

References standing in: lesson 01's sampler and naive generation are each checked alone, with the
references of the exercises they call (top-k, top-p, the sampler) in place of the notebook's own
(`harness.references_standing_in`, which finds no globals on a proxy). So the judge asks the
sandbox to put them in the graded function's globals while its grader runs: the package's own
there when that sandbox has it (the sampler's top-k and top-p: its thousands of calls stay
inside), else a handle to the judge's, called across and revoked when the grader ends (the naive
generation's sampler, whose answer that sandbox withholds).

A fresh process: lesson 04's block hash is also run from its source in another Python (another
PYTHONHASHSEED). Here that Python is a one-shot sandbox with the same withheld package, never
this process; the source is the exercise cells' own (`code_read.py` reads the function's code).
"""
from __future__ import annotations

import importlib
import linecache
import shutil
import subprocess
import sys
import types
from contextlib import contextmanager

from . import sandbox
from .cells import CELL_FILE
from .proxy import ChannelGone

# graders whose function's source is also run in a fresh process (a sandbox of its own here)
FRESH_PROCESS = frozenset({"check_block_hash"})


def standing_in_for(grader: str) -> dict[str, str]:
    """The notebook's global names the grader puts references in for (name -> that exercise's grader)."""
    if grader not in ("check_sampler", "check_generate_naive"):
        return {}
    from ..checks import lesson01_generation, lesson01_sampling
    return {"check_sampler": lesson01_sampling.STANDING_IN,
            "check_generate_naive": lesson01_generation.STANDING_IN}[grader]


@contextmanager
def standing_in(channel, grader: str, name: str, withheld: frozenset):
    """While the block runs, the references stand in for the notebook's own names in the globals
    of `name` (the graded function) in the sandbox behind `channel`."""
    from ..checks.harness import REFERENCES
    names = standing_in_for(grader)
    if not names:
        yield
        return
    values, handed = {}, []
    for global_name, other in names.items():
        if other in withheld:                     # not in that sandbox's package: the judge's own, across
            module, attr = REFERENCES[other].split(":")
            handed.append(getattr(importlib.import_module(module), attr))
            values[global_name] = {"handle": channel.ref(handed[-1])}
        else:
            values[global_name] = {"local": REFERENCES[other]}
    channel.ask({"op": "stand_in", "name": name, "values": values})
    try:
        yield
    finally:
        for reference in handed:
            channel.forget(reference)
        try:
            channel.ask({"op": "stand_back"})
        except ChannelGone:                       # it ended: the grader's own error says so
            pass


def with_fresh_python(fn, package, cells: list[dict]):
    """`fn` (`code_read.ReadHere`: its code read from the cells) made ready for a grader that also
    runs its source in a fresh Python: `inspect.getsource(fn)` reads the cells' lines, and
    `fn.fresh_python(script, stdin)` runs in a sandbox of its own."""
    for cell in cells:
        filename = CELL_FILE.format(cell["index"])
        linecache.cache[filename] = (len(cell["source"]), None, cell["source"].splitlines(True), filename)
    fn.__wrapped__ = types.FunctionType(fn.__code__, {})        # never called: inspect finds the code's lines
    fn.fresh_python = lambda script, source: fresh_python(script, source, package)
    return fn


def fresh_python(script: str, source: str, package, timeout: float = 60) -> str | None:
    """`python -c script` with `source` on stdin, in a one-shot sandbox: its stdout, None when it failed."""
    work = sandbox.workdir("minillm-fresh-")
    proc = sandbox.popen([sys.executable, "-c", script], cwd=work, env={"MINILLM_GRADE": "1"}, package=package,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout)
    try:
        out, _ = proc.communicate(source.encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        out = None
    sandbox.finish(proc, timed_out=out is None)
    shutil.rmtree(work, ignore_errors=True)
    return out.decode(errors="replace").strip() if out is not None and proc.returncode == 0 else None
