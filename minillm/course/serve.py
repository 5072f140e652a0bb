"""The student's side of grading from outside: `python -m minillm.course.serve`, run in a sandbox
by `judge.py`, never by hand.

It holds no grader, no hidden check and (the package copy it imports has them withheld) no
answer: it runs the lesson's imports and the student's exercise cells (each under the file name
`<notebook cell N>`, as `verdict.py` does), then answers the judge's requests: the value of a
name, whether a graded object is the notebook's own, a call of a function or method, an
attribute. Replies are plain data (`wire.py`); anything else stays here, named by a handle
(`proxy.py`), and what the judge hands the student's code (an engine's sequences, its block
manager) stays there, used through proxies. What the student's code prints goes to stderr;
whatever it writes on the channel can only be a wrong answer to the judge's current question.
"""
from __future__ import annotations

import os
import sys
import traceback

from . import wire
from .cells import run_cells
from .proxy import Peer


def answer(request: dict, ns: dict, failed: dict):
    """The requests about the notebook itself (the others are about objects: `proxy.Peer`)."""
    op = request["op"]
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
    peer = Peer(channel_in, channel_out, extra=lambda request: answer(request, ns, failed))
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
