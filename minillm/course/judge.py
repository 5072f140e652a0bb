"""Verdicts decided outside the sandbox: `python -m minillm.course.judge` (started by `isolate.py`
in place of `verdict.py` when grading in a sandbox, never by hand).

The judge is the grader's own code only: it reads the job on stdin and runs no student code.
  - Exercises in `OUTSIDE` are graded here: the student's cells run in a sandbox (`serve.py`)
    whose package has those answers withheld (`withheld.py`), and each grader runs in this
    process, unchanged, on a proxy of the student's object (`proxy.py`): a call's arguments go
    into the sandbox and its result comes back as plain data (`wire.py`; the arguments it
    mutated are written back); what is not data crosses as a handle, both ways, so the engine
    here drives the student's allocator, prefix cache, block manager or scheduler there, and
    that code reads and changes the engine's sequences and block manager here through their
    public face. The sandbox never holds a grader, a reference, a hidden check or a verdict, so
    nothing in it can swap a grader, reach an answer or forge a verdict. A grader that also reads
    the function's code (13's chain_root: no salted `hash()`) gets it compiled here from the
    cells' source the job holds (`code_read.py`), never from the sandbox; one that tests the
    class with issubclass (12's structured outputs) gets a local subclass of the package's base
    that forwards the exercise's methods to the student's instance there (`local_class.py`).
  - Hidden checks (`--extra-checks`) run here too, on a namespace of the lesson's imports
    (imported here) and proxies of what the exercise cells define; their source never enters
    a sandbox.
  - The other exercises are still checked by `verdict.py`, run inside a sandbox of their own
    with the full package (its graders need the references): the sandbox confines that code
    (files, processes, network, memory), but the verdict shares a process with it. Their
    graders do what a proxy cannot: swap the references into the function's globals (01's
    sampler and generate_naive), write into the cache's tensors in place (02), read the
    function's code and source and run it in a fresh process (04's block hash), run async
    generators (07's request stream), launch a Triton kernel (08) or hand over model layers
    (10's sharding).
It writes the verdicts on stdout as `verdict.py` does (the grader's nonce, then JSON).
"""
from __future__ import annotations

import builtins
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading

from . import sandbox, wire
from .code_read import read_here
from .local_class import BASES, local_subclass
from .proxy import ChannelGone, Peer

# graders that run here, on proxies of the student's objects (the module docstring says why not the others)
OUTSIDE = frozenset({"check_ngram_proposer", "check_rejection_sampler", "check_router_choice", "check_rope",
                     "check_top_k", "check_top_p", "check_int8_quantizer", "check_int4_quantizer",
                     "check_choice_constraint", "check_block_allocator", "check_slot_mapping",
                     "check_paged_attention", "check_prefix_cache", "check_copy_on_write", "check_scheduler",
                     "check_preemption", "check_swap", "check_detokenizer", "check_balanced_partition",
                     "check_lora_delta", "check_chain_root", "check_structured_outputs"})
# of those, graders that also read the function's code (`code_read.py`: read here, from the cells' source)
READS_CODE = frozenset({"check_chain_root"})
WITHHELD = "withheld while grading"


SandboxGone = ChannelGone


def _message(e: BaseException) -> str:
    text = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
    cause, chain = e, ""
    for _ in range(8):                                   # the grader's message hides the student's error
        chain += str(cause) + "\n"
        cause = cause.__cause__ or cause.__context__
        if cause is None:
            break
    if WITHHELD in chain:                                # the stub names what was called (withheld.py)
        called = re.search(r"([\w.]+): " + WITHHELD, chain)
        return (f"calls the package's answer {called.group(1) + ' ' if called else ''}(withheld while grading): "
                "the exercise is to write it, not to call it (write it in the exercise cell, with torch and the "
                "lesson's given utilities)")
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


# graders whose student code, in the sandbox, runs the package's answer of another exercise of the
# lesson (lesson 04's copy-on-write BlockManager inherits a BlockManager that builds the package's
# PrefixCache): they are served by a sandbox of their own, which withholds the others' answers only
NEEDS = {"check_copy_on_write": frozenset({"check_prefix_cache"})}


def _graded_here(job: dict, outside: list[dict], hidden: dict | None, checks) -> list[dict]:
    """The checks in `outside` and the hidden checks, graded here on the student's objects in
    sandboxes (one per set of answers withheld, `NEEDS`; the hidden checks in the first)."""
    hidden_fns = []
    if hidden:                                   # imported before any answer comes back from a sandbox
        import importlib
        if hidden.get("folder"):
            sys.path.insert(0, hidden["folder"])
        module = importlib.import_module(hidden["module"])
        hidden_fns = [(hidden["labels"][n], getattr(module, n)) for n in hidden["functions"]]
    every = frozenset(c["grader"] for c in outside)
    groups: dict[frozenset, list[dict]] = {}
    for check in outside:
        groups.setdefault(every - NEEDS.get(check["grader"], frozenset()), []).append(check)
    order = sorted(groups, key=len, reverse=True) or [every]
    opened = [_open(job, withheld) for withheld in order]       # all start at once: their cells run meanwhile
    results = []
    for i, (withheld, started) in enumerate(zip(order, opened)):
        results += _served(started, groups.get(withheld, []), job, hidden_fns if i == 0 else [], checks)
    return results


def _open(job: dict, graders: frozenset):
    """A sandbox serving the student's cells, with the answers of `graders` withheld."""
    from .withheld import package_without
    work = sandbox.workdir("minillm-serve-")
    package = str(package_without(graders, os.environ.get("MINILLM_GRADE_WITHHELD") or None))
    proc = _start("minillm.course.serve", package, work)
    threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
    try:
        wire.send(proc.stdin, {"prelude": job["prelude"], "cells": job["cells"]}, [])
    except (OSError, ValueError):
        pass                                      # it ended already: the first question says so
    return proc, work


def _served(started, outside: list[dict], job: dict, hidden_fns: list, checks) -> list[dict]:
    proc, work = started
    channel = Peer(proc.stdout, proc.stdin, share_containers=True)
    results = []
    try:
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
            if check["grader"] in READS_CODE:
                args = [read_here(a, n, job["cells"]) for a, n in zip(args, check["args"])]
            if check["grader"] in BASES:
                args = [local_subclass(a, check["grader"], check["objects"].get(n)) for a, n in zip(args, check["args"])]
            getattr(checks, check["grader"])(*args)
            results[-1].update(passed=True)
        except SandboxGone as e:
            results[-1]["message"] = sandbox.finish(proc) or str(e)
        except BaseException as e:
            results[-1]["message"] = _message(e)
    ns = {"__name__": "hidden", "__builtins__": builtins}
    for source in job["prelude"] if hidden_fns else []:
        try:
            exec(compile(source, "<lesson imports>", "exec"), ns)
        except BaseException:
            pass
    for name in names if hidden_fns else []:
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
