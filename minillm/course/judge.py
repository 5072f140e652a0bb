"""Verdicts decided outside the sandbox: `python -m minillm.course.judge` (started by `isolate.py`
in place of `verdict.py` when grading in a sandbox, never by hand).

The judge is the grader's own code only: it reads the job on stdin and runs no student code.
  - Exercises in `OUTSIDE` (functions and classes whose inputs and outputs are plain data: lists,
    numbers, tensors, sampling parameters, generators, the course tokenizer) are graded here: the student's cells run in a
    sandbox (`serve.py`) whose package has those answers withheld (`withheld.py`), and each
    grader runs in this process on a proxy (`Remote`) that sends every call's arguments into the
    sandbox and decodes its result as plain data (`wire.py`; the arguments it mutated are
    written back). The sandbox never holds a grader, a reference, a hidden check or a verdict,
    so nothing in it can swap a grader, reach an answer or forge a verdict.
  - Hidden checks (`--extra-checks`) run here too, on a namespace of the lesson's imports
    (imported here) and proxies of what the exercise cells define; their source never enters
    a sandbox.
  - The other exercises (classes driven by the engine, models, Triton kernels: their graders
    hand the student's code objects that cannot cross as data) are still checked by
    `verdict.py`, run inside a sandbox of their own with the full package (its graders need the
    references): the sandbox confines that code (files, processes, network, memory), but the
    verdict shares a process with it.
It writes the verdicts on stdout as `verdict.py` does (the grader's nonce, then JSON).
"""
from __future__ import annotations

import builtins
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading

from . import sandbox, wire

# graders that only call the student's function (lesson 12: class, given the course tokenizer) on
# plain data and read what it returns (not
# lesson 03's slot mapping, which the check plugs into an engine, nor lesson 04's block hash,
# whose check reads the function's code and source)
OUTSIDE = frozenset({"check_ngram_proposer", "check_rejection_sampler", "check_router_choice", "check_rope",
                     "check_top_k", "check_top_p", "check_int8_quantizer", "check_int4_quantizer",
                     "check_choice_constraint"})
WITHHELD = "withheld while grading"
EXCEPTIONS = {e.__name__: e for e in (AssertionError, ValueError, TypeError, IndexError, KeyError, RuntimeError,
                                      NotImplementedError, ZeroDivisionError, AttributeError, ArithmeticError,
                                      OverflowError, LookupError, StopIteration, RecursionError, MemoryError)}


class SandboxGone(RuntimeError):
    """The sandbox stopped answering (it ended, was killed, or broke the protocol)."""


class Channel:
    def __init__(self, proc):
        self.proc, self.lock = proc, threading.Lock()

    def ask(self, request: dict, blobs=()):
        with self.lock:
            try:
                wire.send(self.proc.stdin, request, list(blobs))
                reply, got = wire.receive(self.proc.stdout)
            except (OSError, ValueError, wire.WireError) as e:
                raise SandboxGone(f"the sandbox running your exercise cells stopped answering ({e})") from None
        if "raised" in reply:
            raised = reply["raised"]
            kind, message = str(raised.get("type", "Exception"))[:80], str(raised.get("message", ""))
            if kind in EXCEPTIONS:
                raise EXCEPTIONS[kind](message)
            raise RuntimeError(f"{kind}: {message}")
        if "ok" not in reply:
            raise SandboxGone("the sandbox sent something that is not an answer")
        return wire.decode(reply["ok"], got, lambda n, kind: Remote(self, n, kind))


class Remote:
    """An object that stays in the sandbox: calls and attributes go there as plain data."""

    def __init__(self, channel: Channel, ident: int, kind: str):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_kind", kind)

    def __repr__(self):
        return f"<your {self._kind}>"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._channel.ask({"op": "getattr", "target": self._id, "name": name})

    def _call(self, method, args, kwargs):
        blobs: list[bytes] = []
        ref = _handle_of
        request = {"op": "call", "target": self._id, "method": method,
                   "args": wire.encode(list(args), blobs, ref), "kwargs": wire.encode(dict(kwargs), blobs, ref)}
        reply = self._channel.ask(request, blobs)
        _write_back(list(args), reply["args"])
        _write_back(dict(kwargs), reply["kwargs"])
        return reply["result"]

    def __call__(self, *args, **kwargs):
        return self._call(None, args, kwargs)

    def __len__(self):
        return self._call("__len__", (), {})

    def __getitem__(self, key):
        return self._call("__getitem__", (key,), {})

    def __iter__(self):
        return iter([self[i] for i in range(len(self))])


def _handle_of(obj):
    if isinstance(obj, Remote):
        return obj._id
    raise wire.WireError(f"cannot send a {type(obj).__name__} into the sandbox")


def _write_back(mine, theirs) -> None:
    """What the student's code did to its arguments, done to the grader's objects too."""
    import torch
    if theirs is None:
        return
    if isinstance(mine, list) and isinstance(theirs, list):
        for a, b in zip(mine, theirs):
            _write_back(a, b)
        if [type(x) for x in mine] != [type(x) for x in theirs] or not all(
                isinstance(x, (torch.Tensor, torch.Generator, list, dict)) for x in mine):
            mine[:] = theirs
    elif isinstance(mine, dict) and isinstance(theirs, dict):
        for k in mine:
            if k in theirs:
                _write_back(mine[k], theirs[k])
    elif isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor):
        if mine.shape == theirs.shape and mine.dtype == theirs.dtype:
            mine.copy_(theirs)
    elif isinstance(mine, torch.Generator) and isinstance(theirs, torch.Generator):
        mine.set_state(theirs.get_state())


def _message(e: BaseException) -> str:
    text = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
    cause, chain = e, ""
    for _ in range(8):                                   # the grader's message hides the student's error
        chain += str(cause)
        cause = cause.__cause__ or cause.__context__
        if cause is None:
            break
    if WITHHELD in chain:
        return ("calls the package's answer (withheld while grading): the exercise is to write it, not to call "
                "it (write it in the exercise cell, with torch and the lesson's given utilities)")
    return text


def _start(module: str, package, work):
    return sandbox.popen([sys.executable, "-m", module], cwd=work, env={"MINILLM_GRADE": "1"}, package=package,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _inside(job: dict, checks: list[dict]):
    """verdict.py, in a sandbox with the full package, for the checks that cannot be graded from here."""
    nonce = secrets.token_hex(16)
    work = sandbox.workdir("minillm-verdict-")
    sub = {"nonce": nonce, "prelude": job["prelude"], "cells": job["cells"], "checks": checks, "extra": None}
    proc = _start("minillm.course.verdict", None, work)
    result = {}

    def talk():
        out, err = proc.communicate(json.dumps(sub).encode())
        result["out"], result["err"] = out.decode(errors="replace"), err.decode(errors="replace")
    thread = threading.Thread(target=talk, daemon=True)
    thread.start()
    return proc, thread, result, nonce, work


def _finish_inside(started) -> list[dict]:
    proc, thread, result, nonce, work = started
    thread.join()
    failure = sandbox.finish(proc)
    shutil.rmtree(work, ignore_errors=True)
    line = next((x for x in reversed(result.get("out", "").splitlines()) if x.startswith(nonce)), None)
    if line is None:
        tail = " | ".join(result.get("err", "").strip().splitlines()[-3:])[-300:]
        return failure or f"the exercise cells, run again for grading, ended the process (exit {proc.returncode}): {tail}"
    return json.loads(line[len(nonce):])


def main() -> int:
    job = json.loads(sys.stdin.read())
    out = sys.stdout
    nonce = job.pop("nonce")
    sandbox.use(os.environ.get("MINILLM_GRADE_SANDBOX", "bwrap"))
    outside = [c for c in job["checks"] if c["grader"] in OUTSIDE]
    inside = [c for c in job["checks"] if c["grader"] not in OUTSIDE]
    hidden = job.get("extra") or None
    started = _inside(job, inside) if inside else None
    results = []
    if outside or hidden:
        import torch                               # only here: a lesson graded inside pays nothing for the judge
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
        import minillm.checks as checks
        results += _graded_here(job, outside, hidden, checks)
    if started:
        got = _finish_inside(started)
        mine = {c["exercise"] for c in inside}            # the sandbox speaks for its own exercises only
        got = [{"exercise": r["exercise"], "passed": r.get("passed") is True, "message": str(r.get("message", ""))}
               for r in got if isinstance(r, dict) and r.get("exercise") in mine] if isinstance(got, list) else got
        if isinstance(got, str):
            got = [{"exercise": c["exercise"], "passed": False, "message": got} for c in inside]
        results = got + results
    out.write(nonce + json.dumps(results) + "\n")
    out.flush()
    return 0


def _graded_here(job: dict, outside: list[dict], hidden: dict | None, checks) -> list[dict]:
    from .withheld import package_without
    work = sandbox.workdir("minillm-serve-")
    graders = frozenset(c["grader"] for c in job.get("lesson_checks", job["checks"]) if c["grader"] in OUTSIDE)
    package = str(package_without(graders, os.environ.get("MINILLM_GRADE_WITHHELD") or None))
    proc = _start("minillm.course.serve", package, work)
    drain = threading.Thread(target=lambda: proc.stderr.read(), daemon=True)
    drain.start()
    channel = Channel(proc)
    results = []
    hidden_fns = []
    if hidden:                                   # imported before any answer comes back from the sandbox
        import importlib
        if hidden.get("folder"):
            sys.path.insert(0, hidden["folder"])
        module = importlib.import_module(hidden["module"])
        hidden_fns = [(hidden["labels"][n], getattr(module, n)) for n in hidden["functions"]]
    try:
        wire.send(proc.stdin, {"prelude": job["prelude"], "cells": job["cells"]}, [])
        listing = channel.ask({"op": "names"})
        names, failed = listing["names"], listing["failed"]
    except (SandboxGone, OSError, wire.WireError) as e:
        why = sandbox.finish(proc) or str(e)
        return [{"exercise": c["exercise"], "passed": False, "message": why} for c in outside] + \
            [{"exercise": label, "passed": False, "message": why} for label, _ in hidden_fns]
    for check in outside:
        results.append({"exercise": check["exercise"], "passed": False, "message": ""})
        try:
            if check["exercise"] in failed:
                results[-1]["message"] = failed[check["exercise"]]
                continue
            why = None
            for name in check["args"]:
                why = why or channel.ask({"op": "authorship", "name": name,
                                          "methods": check["objects"].get(name)})["why"] \
                    if name in check["objects"] or name not in names else why
            if why:
                results[-1]["message"] = why
                continue
            args = [channel.ask({"op": "get", "name": n}) for n in check["args"]]
            getattr(checks, check["grader"])(*args)
            results[-1].update(passed=True)
        except SandboxGone as e:
            results[-1]["message"] = sandbox.finish(proc) or str(e)
        except BaseException as e:
            results[-1]["message"] = _message(e)
    ns = {"__name__": "hidden", "__builtins__": builtins}
    for source in job["prelude"]:
        try:
            exec(compile(source, "<lesson imports>", "exec"), ns)
        except BaseException:
            pass
    for name in names:
        if name in ns:                           # the lesson's imports: the judge's own
            continue
        try:
            ns[name] = channel.ask({"op": "get", "name": name})
        except BaseException:
            continue
    for label, fn in hidden_fns:
        try:
            fn(ns)
            results.append({"exercise": label, "passed": True, "message": ""})
        except SandboxGone as e:
            results.append({"exercise": label, "passed": False, "message": sandbox.finish(proc) or str(e)})
        except BaseException as e:
            results.append({"exercise": label, "passed": False, "message": _message(e)})
    try:
        wire.send(proc.stdin, {"op": "bye"}, [])
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    sandbox.finish(proc)
    shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(3)
