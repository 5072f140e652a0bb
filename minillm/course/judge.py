"""Verdicts decided outside the sandbox: `python -m minillm.course.judge` (started by `isolate.py`
in place of `verdict.py` when grading in a sandbox, never by hand).

The judge is the grader's own code only: it reads the job on stdin and runs no student code.
Every exercise is graded here (`OUTSIDE`; `verdict.py`, which shares a process with the
student's code, runs only with `--sandbox none`):
  - the student's cells run in a sandbox (`serve.py`) whose package has the lesson's answers
    withheld (`withheld.py`), and each grader runs in this process, unchanged, on a proxy of the
    student's object (`proxy.py`): a call's arguments go into the sandbox and its result comes
    back as plain data (`wire.py`; the arguments it mutated are written back); what is not data
    crosses as a handle, both ways, so the engine here drives the student's allocator, prefix
    cache, block manager, scheduler or KV cache there, and that code reads and changes the
    engine's sequences and block manager here through their public face. The sandbox never
    holds a grader, a reference of its exercise, a hidden check or a verdict, so nothing in it
    can swap a grader, reach an answer or forge a verdict.
  - Some graders need more (`outside_help.py`, `code_read.py`, `local_class.py`): 01's sampler
    and naive loop get the references of the exercises they call standing in, put into their
    globals across the sandbox; 04's block hash and 13's chain_root graders read the function's
    code (no salted `hash()`), compiled here from the cells' source the job holds, and 04's also
    runs its source in a fresh Python, a one-shot sandbox; 12's structured outputs grader, which
    tests the class with issubclass, gets a local subclass of the package's base that forwards
    the exercise's methods to the student's instance there.
  - Exercises that cannot cross as a proxy (07's request stream, 08's Triton kernel, 10's layer
    sharding) are split (`collect.py`): a collect half runs the student's object in the sandbox
    on inputs drawn here at grading time and returns plain data; the judge half compares it
    with the reference here, with the grader's own messages.
  - Hidden checks (`--extra-checks`) run here too, on a namespace of the lesson's imports
    (imported here) and proxies of what the exercise cells define; their source never enters
    a sandbox.
It writes the verdicts on stdout as `verdict.py` does (the grader's nonce, then JSON).
"""
from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import subprocess
import sys
import threading

from . import sandbox, wire
from .code_read import read_here
from .collect import COLLECTED, judge_collected
from .local_class import BASES, local_subclass
from .outside_help import FRESH_PROCESS, standing_in, with_fresh_python
from .proxy import ChannelGone, Peer

# every grader: they run here, on proxies of the student's objects, or split in halves (`collect.py`)
OUTSIDE = frozenset({"check_ngram_proposer", "check_rejection_sampler", "check_router_choice", "check_rope",
                     "check_top_k", "check_top_p", "check_int8_quantizer", "check_int4_quantizer",
                     "check_choice_constraint", "check_block_allocator", "check_slot_mapping",
                     "check_paged_attention", "check_prefix_cache", "check_copy_on_write", "check_scheduler",
                     "check_preemption", "check_swap", "check_detokenizer", "check_balanced_partition",
                     "check_lora_delta", "check_chain_root", "check_structured_outputs", "check_sampler",
                     "check_generate_naive", "check_contiguous_cache", "check_block_hash"}) | frozenset(COLLECTED)
# of those, graders that also read the function's code (`code_read.py`: read here, from the cells' source)
READS_CODE = frozenset({"check_chain_root", "check_block_hash"})
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


def main() -> int:
    job = json.loads(sys.stdin.read())
    out = sys.stdout
    nonce = job.pop("nonce")
    sandbox.use(os.environ.get("MINILLM_GRADE_SANDBOX", "bwrap"))
    outside = [c for c in job["checks"] if c["grader"] in OUTSIDE]
    hidden = job.get("extra") or None
    results = [{"exercise": c["exercise"], "passed": False,                  # a grader added without a judge here
                "message": f"{c['grader']} cannot be judged outside the sandbox (not in judge.OUTSIDE)"}
               for c in job["checks"] if c["grader"] not in OUTSIDE]
    if outside or hidden:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
        import minillm.checks as checks
        results += _graded_here(job, outside, hidden, checks)
    out.write(nonce + json.dumps(results) + "\n")
    out.flush()
    return 0


# graders whose student code, in the sandbox, runs the package's answer of another exercise of the
# lesson (lesson 04's copy-on-write BlockManager inherits a BlockManager that builds the package's
# PrefixCache and hashes blocks; lesson 01's sampler and naive generation are graded with the
# references of top-k and top-p standing in, `outside_help.py`): they are served by a sandbox of
# their own, which withholds the others' answers only
NEEDS = {"check_copy_on_write": frozenset({"check_prefix_cache", "check_block_hash"}),
         "check_sampler": frozenset({"check_top_k", "check_top_p"}),
         "check_generate_naive": frozenset({"check_top_k", "check_top_p"}),
         "check_request_stream": frozenset({"check_detokenizer"})}   # its server detokenizes (collect.py)


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
        results += _served(started, withheld, groups.get(withheld, []), job, hidden_fns if i == 0 else [], checks)
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
    return proc, work, package


def _served(started, withheld: frozenset, outside: list[dict], job: dict, hidden_fns: list, checks) -> list[dict]:
    proc, work, package = started
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
            if check["grader"] in COLLECTED:           # collected in the sandbox, judged here (collect.py)
                judge_collected(check, channel.ask)
                results[-1].update(passed=True)
                continue
            args = [channel.ask({"op": "get", "name": n}) for n in check["args"]]
            if check["grader"] in READS_CODE:
                args = [read_here(a, n, job["cells"]) for a, n in zip(args, check["args"])]
            if check["grader"] in FRESH_PROCESS:
                args = [with_fresh_python(a, package, job["cells"]) for a in args]
            if check["grader"] in BASES:
                args = [local_subclass(a, check["grader"], check["objects"].get(n)) for a, n in zip(args, check["args"])]
            with standing_in(channel, check["grader"], (check["args"] or [""])[0], withheld):
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
