"""A student's subclass of a package class, graded from outside the sandbox by a grader that
asks `issubclass(cls, Base)` (lesson 12's `check_structured_outputs`) and hands the class to the
engine, which builds it and calls the base's own methods too.

A proxy of the class (`proxy.py`) is no subclass of anything here, so the judge gives the grader
a local subclass of the package's base instead: each instance is the base here (its constructor
and the methods the exercise does not override run here, on the judge's package) and holds an
instance of the student's class, made with the same arguments in the sandbox, to which the
exercise's methods go. Inside, those methods of the base are withheld (`withheld.METHODS`), so
`super()` reaches no answer.
"""
from __future__ import annotations

import importlib

# grader -> the package's base class its exercise subclasses
BASES = {"check_structured_outputs": "minillm.structured.matchers:StructuredOutputs"}


def local_subclass(remote_cls, grader: str, methods: list[str] | None) -> type:
    module, name = BASES[grader].split(":")
    base = getattr(importlib.import_module(module), name)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._remote = remote_cls(*args, **kwargs)

    def forward(method):
        def call(self, *args, **kwargs):
            return getattr(self._remote, method)(*args, **kwargs)
        call.__name__ = method
        return call

    space = {m: forward(m) for m in methods or () if not m.startswith("__")}
    space["__init__"] = __init__
    return type(f"{name}AcrossTheSandbox", (base,), space)
