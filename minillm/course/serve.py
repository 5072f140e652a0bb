"""The student's side of grading from outside: `python -m minillm.course.serve`, run in a sandbox
by `judge.py`, never by hand.

It holds no grader, no hidden check and (the package copy it imports has them withheld) no
answer: it runs the lesson's imports and the student's exercise cells (each under the file name
`<notebook cell N>`, as `verdict.py` does), then answers the judge's requests: the value of a
name, whether a graded object is the notebook's own, a call of a function or method, an
attribute; and, while one grader runs, references of other exercises standing in for the
notebook's own in the graded function's globals (`outside_help.py`). Replies are plain data
(`wire.py`); anything else stays here, named by a handle (`proxy.py`), and what the judge hands
the student's code (an engine's sequences, its block manager) stays there, used through proxies.
What the student's code prints goes to stderr; whatever it writes on the channel can only be a
wrong answer to the judge's current question.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback

from . import wire
from .cells import run_cells
from .proxy import Peer


_standing: list[tuple[dict, str, object]] = []         # (globals, name, the notebook's own value) to put back


def answer(request: dict, ns: dict, failed: dict, peer: Peer | None = None):
    """The requests about the notebook itself (the others are about objects: `proxy.Peer`)."""
    op = request["op"]
    if op == "stand_in":                                 # {name: {"local": "module:attr"} | {"handle": the judge's}}
        space = getattr(ns.get(request["name"]), "__globals__", None)
        for name, value in request["values"].items() if isinstance(space, dict) else ():
            if name in space:
                module, attr = str(value.get("local", ":")).split(":")
                new = getattr(importlib.import_module(module), attr) if module.startswith("minillm.") \
                    else peer.decode(value["handle"], [])
                _standing.append((space, name, space[name]))
                space[name] = new
        return None
    if op == "stand_back":
        while _standing:
            space, name, own = _standing.pop()
            space[name] = own
        return None
    if op == "names":
        return {"names": sorted(k for k in ns if not k.startswith("__")), "failed": failed}
    if op == "authorship":
        from .verdict import authorship
        name = request["name"]
        if name not in ns:
            return {"why": f"not written in the notebook: the exercise cell does not define {name} "
                           "(write it in the exercise cell)"}
        return {"why": authorship(name, ns[name], request.get("methods"))}
    if op == "get":
        return ns[request["name"]]
    if op == "collect":                                  # a grader's collect half (collect.py)
        from .collect import run_collect
        return run_collect(request, ns)
    raise ValueError(f"unknown request {op!r}")


def main() -> int:
    channel_in = os.fdopen(os.dup(0), "rb")
    channel_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)                                         # the student's prints go to stderr
    sys.stdout = sys.stderr
    header, _ = wire.receive(channel_in)
    import torch
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    ns, failed = run_cells(header)
    sys.stdout = sys.stderr
    peer = Peer(channel_in, channel_out, extra=lambda request: answer(request, ns, failed, peer))
    while True:
        request, blobs = wire.receive(channel_in)
        if request.get("op") == "bye":
            break
        peer.serve(request, blobs)
        sys.stdout = sys.stderr
    os._exit(0)                                           # no student atexit hook or thread runs after


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        os._exit(3)
