"""The student's side of grading from outside: `python -m minillm.course.serve`, run in a sandbox
by `judge.py`, never by hand.

It holds no grader, no hidden check and (the package copy it imports has them withheld) no
answer: it runs the lesson's imports and the student's exercise cells (each under the file name
`<notebook cell N>`, as `verdict.py` does), then answers the judge's requests: the value of a
name, whether a graded object is the notebook's own, a call of a function or method on plain
data, an attribute. Replies are plain data (`wire.py`); anything else stays here, named by a
handle. What the student's code prints goes to stderr; whatever it writes on the channel can
only be a wrong answer to the judge's current question.
"""
from __future__ import annotations

import os
import sys
import traceback

from . import wire
from .cells import run_cells

NO_REPLY = object()


class Objects:
    """The objects the judge holds handles to, by id."""

    def __init__(self):
        self.by_id, self.ids = {}, {}

    def ref(self, obj) -> int:
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = len(self.by_id)
            self.by_id[self.ids[key]] = obj
        return self.ids[key]

    def get(self, n: int, kind: str = ""):
        return self.by_id[n]


def _mutable(value):
    """An argument as sent back to the judge (what the call may have changed in it), else None."""
    import torch
    return value if isinstance(value, (list, dict, torch.Tensor, torch.Generator, bytearray)) else None


def answer(request: dict, blobs: list[bytes], ns: dict, objects: Objects):
    op = request["op"]
    if op == "names":
        return {"names": sorted(k for k in ns if not k.startswith("__")), "failed": request["failed"]}
    if op == "authorship":
        from .verdict import authorship
        name = request["name"]
        if name not in ns:
            return {"why": f"not written in the notebook: the exercise cell does not define {name} "
                           "(write it in the exercise cell)"}
        return {"why": authorship(name, ns[name], request.get("methods"))}
    if op == "get":
        return ns[request["name"]]
    target = objects.get(int(request["target"]))
    if op == "getattr":
        return getattr(target, request["name"])
    if op == "call":
        args = wire.decode(request["args"], blobs, objects.get)
        kwargs = wire.decode(request["kwargs"], blobs, objects.get)
        method = request.get("method")
        result = (getattr(target, method) if method else target)(*args, **kwargs)
        return {"result": result, "args": [_mutable(a) for a in args], "kwargs": {k: _mutable(v) for k, v in kwargs.items()}}
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
    objects = Objects()
    while True:
        request, blobs = wire.receive(channel_in)
        if request.get("op") == "bye":
            break
        request["failed"] = failed
        out: list[bytes] = []
        try:
            value = answer(request, blobs, ns, objects)
            reply = {"ok": wire.encode(value, out, objects.ref)}
        except BaseException as e:                        # SystemExit and KeyboardInterrupt included
            out = []
            reply = {"raised": {"type": type(e).__name__, "message": str(e)[:4000]}}
        sys.stdout = sys.stderr
        wire.send(channel_out, reply, out)
    os._exit(0)                                           # no student atexit hook or thread runs after


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        os._exit(3)
