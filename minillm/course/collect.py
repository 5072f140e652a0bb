"""Collect inside, judge outside: the graders whose exercise cannot cross the sandbox as a proxy
(a decoder layer run on simulated ranks, a Triton kernel the package's launch code launches, a
stream driven by an event loop and a server) are split in two halves, both in the package
(`COLLECTED`: lesson 10's layer sharding, lesson 08's kernel, lesson 07's request stream).

  - The collect half runs in the sandbox, on the student's object, with inputs the judge chose
    (a seed drawn at grading time): it builds the inputs from them, runs the student's code and
    returns plain data (outputs, shapes, what a simulated group recorded, an exception as data:
    `checks.collected.error`). It holds no reference, no expected value and no verdict.
  - The judge half runs in the judge (`judge.py`): it asks for the data (`collect(**inputs)`),
    builds the same inputs, runs the reference on them, and raises the grader's own messages
    and hints (`rebuilt` gives back the student's exception, so "your layer raised KeyError: ..."
    reads as it always did).

In a notebook (and with `--sandbox none`) the lesson's check runs both halves in one process:
`check_x(obj)` is `judge_x(lambda **inputs: collect_x(obj, **inputs), seed=FIXED)`. In the
sandbox, `serve.py` answers the judge's {"op": "collect"} with `run_collect`, and `judge.py`
hands the judge half `collect` that asks for it (`judge_collected`); a reply that holds
anything but data (a handle to an object in the sandbox) is refused. A forged reply (the
collect half swapped inside) must then hold the right outputs for inputs drawn after the
student's code ran (10's shards and outputs of a layer drawn from the seed, 08's attention over
caches drawn from it): solving the exercise. Lesson 07's record is of behaviour (what a handler
got, what the stream sent), which a forger who knows what the judge looks for could make up.
"""
from __future__ import annotations

import importlib
import secrets

from ..checks.collected import error, is_error, rebuilt  # noqa: F401 (the halves' helpers)

# grader -> (the collect half, run in the sandbox; the judge half, run in the judge): "module:function"
COLLECTED = {
    "check_layer_sharding": ("minillm.checks.lesson10_ranks:collect_sharding",
                             "minillm.checks.lesson10_sharding:judge_layer_sharding"),
    "check_paged_decode_kernel": ("minillm.checks.lesson08_launch:collect_decode",
                                  "minillm.checks.lesson08:judge_paged_decode_kernel"),
    "check_request_stream": ("minillm.checks.lesson07_collect:collect_stream",
                             "minillm.checks.lesson07_stream:judge_request_stream"),
}

REPLACED = "the grader's collect half, in the sandbox, was replaced"


def _function(dotted: str):
    module, name = dotted.split(":")
    return getattr(importlib.import_module(module), name)


def run_collect(request: dict, ns: dict):
    """The sandbox's side (`serve.py`): the collect half of `request["grader"]` on the notebook's
    objects named in `request["args"]`, with the judge's `inputs` (JSON values)."""
    grader = request.get("grader")
    if grader not in COLLECTED:
        raise ValueError(f"no collect half for {grader!r}")
    inputs = request.get("inputs") or {}
    return _function(COLLECTED[grader][0])(*[ns[name] for name in request["args"]], **inputs)


def judge_collected(check: dict, ask) -> None:
    """The judge's side (`judge.py`): the judge half of `check["grader"]`, collecting from the
    sandbox through `ask` (the channel's), on inputs seeded here and now."""
    grader = check["grader"]

    def collect(**inputs):
        data = plain(ask({"op": "collect", "grader": grader, "args": check["args"], "inputs": inputs}))
        if not isinstance(data, dict):
            raise AssertionError(f"{REPLACED}: it returned a {type(data).__name__}, not a record")
        return data
    _function(COLLECTED[grader][1])(collect, seed=secrets.randbelow(1 << 30))


def plain(value):
    """`value`, if it is data all the way down (else AssertionError: a collect half returns data)."""
    from .proxy import Proxy
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, Proxy):
            raise AssertionError(f"{REPLACED}: its record holds an object of the sandbox, not data")
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
    return value
