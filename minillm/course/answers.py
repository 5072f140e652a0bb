"""The package's answer kept out of the exercise it answers (used by `verdict.py`).

The package ships every exercise's answer (`harness.REFERENCES`: `minillm.sample.sampler.sample`
for lesson 01's sampler, `ContinuousBatchingScheduler.schedule` for lesson 05, ...), and the
graders need it to compare against. The authorship rule (`verdict.authorship`) refuses a graded
object that *is* the answer (an import, an alias, an empty subclass), but a notebook function
that merely *calls* it (`def sample(...): return sampler.sample(...)`, `super().schedule()`, an
import of it under another name) is code of the notebook all the same. Two rules close that:

  - at run time (Python code, the robust part): in the verdict process, before any student code
    runs, every answer function is wrapped *in place*, so that every reference to it (the
    graders' own imports, a student's alias taken earlier, the engine's) reaches the wrapper.
    A plain function keeps its identity and gets a small trampoline as its `__code__`; an
    exercise method is replaced in its class (the reference class and every package subclass
    that overrides it: `Scheduler.schedule` answers lesson 05 too). While exercise E is being
    checked, a call of E's answer with a frame of a notebook cell (`<notebook cell N>`) anywhere
    above it on the stack is recorded, and E fails with "calls the package's answer ...". The
    graders' own calls of the reference have no notebook frame above them, so they run as
    before, and no private copy is needed; answers of *other* exercises stay usable (lesson 01's
    generate_naive may sample with the reference sampler that stands in for the student's).
    However the answer is reached (an alias, `super()`, `getattr`, a package function that calls
    it), the call is seen; only a call moved off the stack (another thread) is not.
  - statically (for what does not run as Python: a Triton kernel is compiled on a GPU): the
    names a graded object's code uses (`co_names`, nested code included) are looked up in its
    globals, and attributes of the modules and classes found there; any that is the answer
    fails the exercise the same way.

Rebuilding the answer from other package helpers is not caught by either rule, as a student may
use the lesson's given utilities; the graders' checks still decide whether the result is right.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types

NOTEBOOK = "<notebook cell "
TRAMPOLINE_FILE = "<minillm answer guard>"


def _trampoline(*args, _minillm_answer=None, **kwargs):
    seen, call = _minillm_answer
    seen()
    return call(*args, **kwargs)


def _holds(cell, obj) -> bool:
    try:
        return cell.cell_contents is obj
    except ValueError:                                  # an empty cell
        return False


def _innermost(fn):
    """The function under decorators that keep it in their closure (torch.inference_mode); a
    `__wrapped__` the wrapper does not hold is not followed (it could be any function)."""
    for _ in range(8):
        inner = getattr(fn, "__wrapped__", None)
        if inner is None or not any(_holds(c, inner) for c in getattr(fn, "__closure__", None) or ()):
            break
        fn = inner
    return fn


def _reference(grader: str):
    """(its dotted name, the reference object) of the exercise `grader` checks."""
    from ..checks.harness import REFERENCES
    module, attribute = REFERENCES[grader].split(":")
    return f"{module}.{attribute}", getattr(importlib.import_module(module), attribute)


def _subclasses(cls) -> list[type]:
    out, todo = [], [cls]
    while todo:
        k = todo.pop()
        if k.__module__.startswith("minillm.") and k not in out:
            out.append(k)
            todo.extend(k.__subclasses__())
    return out


def answers_of(grader: str, methods: list[str]) -> list[tuple[str, object, type | None, str | None]]:
    """The package's answer to the exercise `grader` checks: (label, object, class, method name)
    for each exercise method of the reference class and of the package's subclasses that override
    it; (label, function or kernel, None, None) for a function exercise and for each function of
    `harness.PART_ANSWERS` (a helper the exercise cell writes beside the graded class)."""
    from ..checks.harness import PART_ANSWERS
    try:
        name, target = _reference(grader)
    except Exception:
        return []
    parts = []
    for dotted in PART_ANSWERS.get(grader, ()):
        module, attribute = dotted.split(":")
        parts.append((f"{module}.{attribute}", getattr(importlib.import_module(module), attribute), None, None))
    if not isinstance(target, type):
        return [(name, target, None, None)] + parts
    return [(f"{k.__module__}.{k.__qualname__}.{m}", vars(k)[m], k, m)
            for k in _subclasses(target) for m in methods if m in vars(k)] + parts


class AnswerGuard:
    """Wraps the answers of the exercises checked in this process and records, per exercise, the
    first call of its answer from a notebook cell while that exercise is checked."""

    def __init__(self):
        self.watching: str | None = None
        self.hits: dict[str, str] = {}
        self.answers: dict[str, list[tuple[str, object]]] = {}      # exercise -> (label, answer) to look for

    def _seen(self, exercise: str, label: str):
        def seen():
            if self.watching != exercise or exercise in self.hits:
                return
            frame = sys._getframe(2)
            while frame is not None:
                if frame.f_code.co_filename.startswith(NOTEBOOK):
                    self.hits[exercise] = label
                    return
                frame = frame.f_back
        return seen

    def install(self, exercise: str, grader: str, methods: list[str]) -> None:
        for label, obj, cls, name in answers_of(grader, methods):
            self.answers.setdefault(exercise, []).append((label, obj))
            if cls is not None:
                setattr(cls, name, self._wrapped(obj, self._seen(exercise, label)))
                self.answers[exercise].append((label, vars(cls)[name]))
            else:
                self._guard_in_place(obj, self._seen(exercise, label))

    @staticmethod
    def _wrapped(raw, seen):
        """A class attribute (function, staticmethod, classmethod or property) whose function
        first calls `seen`."""
        def wrap(fn):
            @functools.wraps(fn)
            def guarded(*args, **kwargs):
                seen()
                return fn(*args, **kwargs)
            del guarded.__wrapped__                 # the original stays out of reach
            guarded.__signature__ = inspect.signature(fn)
            return guarded
        if isinstance(raw, property):
            return property(wrap(raw.fget), raw.fset, raw.fdel, raw.__doc__)
        if isinstance(raw, (staticmethod, classmethod)):
            return type(raw)(wrap(raw.__func__))
        return wrap(raw) if callable(raw) else raw

    @staticmethod
    def _guard_in_place(fn, seen) -> None:
        """Give the plain function under `fn` the trampoline as its code (same object, so every
        reference already taken is guarded too). A Triton kernel or a closure is left as it is."""
        inner = _innermost(fn)
        if not isinstance(inner, types.FunctionType) or inner.__code__.co_freevars:
            return
        original = types.FunctionType(inner.__code__, inner.__globals__, inner.__name__, inner.__defaults__)
        original.__kwdefaults__ = inner.__kwdefaults__
        signature = inspect.signature(inner)
        inner.__code__ = _trampoline.__code__.replace(co_name=inner.__code__.co_name, co_filename=TRAMPOLINE_FILE,
                                                      co_qualname=inner.__code__.co_qualname)
        inner.__defaults__, inner.__kwdefaults__ = None, {"_minillm_answer": (seen, original)}
        inner.__signature__ = signature

    def named_in(self, exercise: str, graded: list) -> str | None:
        """The static rule: the label of an answer of `exercise` that the code of a graded function
        or kernel names, through its globals or their attributes (classes are left to the run-time
        rule: their methods run as Python wherever they are checked)."""
        wanted = {}
        for label, obj in self.answers.get(exercise, []):
            for x in (obj, getattr(obj, "fn", None), _innermost(obj)):
                if x is not None:
                    wanted[id(x)] = label
        for obj in graded:
            for fn in _functions(obj):
                found = _names(fn, wanted)
                if found:
                    return found
        return None


def _functions(obj) -> list:
    if isinstance(obj, type):
        return []
    fn = getattr(obj, "fn", obj)                     # a Triton kernel: its Python function
    return [_innermost(fn)] if isinstance(_innermost(fn), types.FunctionType) else []


def _names(fn, wanted: dict[int, str]) -> str | None:
    space = getattr(fn, "__globals__", {})
    codes, names = [fn.__code__], set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    for name in names:
        value = space.get(name)
        if id(value) in wanted:
            return wanted[id(value)]
        if isinstance(value, (types.ModuleType, type)):
            for attr in names:
                try:
                    inner = inspect.getattr_static(value, attr)
                except AttributeError:
                    continue
                inner = getattr(inner, "__func__", inner)
                if id(inner) in wanted:
                    return wanted[id(inner)]
    return None
