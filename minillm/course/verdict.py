"""Verdicts outside the student's kernel: `python -m minillm.course.verdict` (started by
`grade.py`, never by hand) reads a job as JSON on stdin, runs it in this plain Python process
(no IPython, no nbval) and writes the verdicts as one JSON line on stdout. Only with
`--sandbox none`: in a sandbox every verdict is decided outside it, by `judge.py`.

The order is what makes the verdicts the grader's own:
  1. the graders (`minillm.checks`), the hidden checks and the references are imported, and this
     module keeps its own references to them; a snapshot records the identity of every function
     and class of the package's modules, of `torch`, `torch.Tensor`, `torch.nn.functional` and
     `builtins`, and of the package's `sys.modules` entries; the answers of the exercises are
     wrapped in place (`answers.AnswerGuard`);
  2. the lesson's imports run (the import statements of the course's own cells), then the
     student's exercise cells, one at a time, each compiled with the file name
     `<notebook cell N>`; after each, anything of the snapshot that changed is tampering by
     that cell's exercises (and is put back);
  3. every check runs with the saved grader on the objects the check cell names: first the
     rule that they are the student's own (a function's code comes from a notebook cell; a
     class's exercise methods are defined in the notebook, not inherited from the package) and
     that a function or kernel does not name the package's answer, then the grader itself, during
     which a call of the exercise's answer from notebook code fails it; then the hidden checks,
     on the namespace the cells built.
Each cell's source is put in `linecache` under its file name, as IPython does, so that code
that reads a function's source (Triton's @jit, lesson 04's fresh-process hash check) works
here too; with no GPU, TRITON_INTERPRET=1 is set first, as lesson 08's first cell does.

Student output goes to stderr; the verdict line carries a nonce the student code never sees
through ordinary means. This is a boundary against the known ways to fake a verdict, not a
sandbox: the static scan in `grade.py` reports the introspection (frames, gc, ctypes) a
determined cheat would need.
"""
from __future__ import annotations

import builtins
import importlib
import json
import os
import sys
import traceback
import types

from .answers import AnswerGuard, _innermost
from .cells import run_cells


def _snapshot() -> dict:
    import torch
    import torch.nn.functional as F
    spaces = {"builtins": vars(builtins), "torch": vars(torch), "torch.Tensor": vars(torch.Tensor),
              "torch.nn.functional": vars(F)}
    for name, module in list(sys.modules.items()):
        if (name == "minillm" or name.startswith("minillm.")) and isinstance(module, types.ModuleType):
            spaces[name] = vars(module)
    snap = {}
    for where, space in spaces.items():
        for attr, obj in list(space.items()):
            if callable(obj) or isinstance(obj, types.ModuleType):
                snap[where, attr] = obj
    for name, module in list(sys.modules.items()):
        if name == "minillm" or name.startswith("minillm."):
            snap["sys.modules", name] = module
    return snap


def _owner(where: str):
    if where == "builtins":
        return builtins
    if where == "torch.Tensor":
        import torch
        return torch.Tensor
    return sys.modules.get(where) or importlib.import_module(where)


def _changed(snap: dict) -> list[str]:
    """What of the snapshot student code replaced (each put back)."""
    found = []
    for (where, attr), obj in snap.items():
        if where == "sys.modules":
            if sys.modules.get(attr) is not obj:
                found.append(f"sys.modules[{attr!r}]")
                sys.modules[attr] = obj
            continue
        owner = _owner_safe(where, snap)
        if owner is None:
            continue
        current = vars(owner).get(attr, _MISSING)
        if current is not obj:
            found.append(f"{where}.{attr}")
            try:
                setattr(owner, attr, obj)
            except (AttributeError, TypeError):
                pass
    return found


_MISSING = object()


def _owner_safe(where, snap):
    module = snap.get(("sys.modules", where))
    if module is not None:
        return module
    try:
        return _owner(where)
    except Exception:
        return None


def _code_of(obj):
    """The code object behind a function, a method, a Triton kernel, or None."""
    for _ in range(6):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        elif _innermost(obj) is not obj:        # a decorator's wrapper (torch.inference_mode): what it wraps
            obj = _innermost(obj)
        elif hasattr(obj, "__code__"):
            return obj.__code__
        elif hasattr(obj, "fn"):                 # triton.JITFunction
            obj = obj.fn
        elif hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        else:
            return None
    return None


def _from_notebook(code) -> bool:
    return code is not None and code.co_filename.startswith("<notebook cell ")


def _where(code) -> str:
    return code.co_filename if code is not None else "somewhere outside the notebook"


def authorship(name: str, obj, methods: list[str] | None) -> str | None:
    """Why `obj` (the graded `name`) is not the student's own work, or None when it is."""
    if isinstance(obj, type):
        for method in methods or []:
            owner = next((k for k in obj.__mro__ if method in vars(k)), None)
            code = _code_of(vars(owner)[method]) if owner is not None else None
            if not _from_notebook(code):
                where = f"inherited from {owner.__module__}.{owner.__qualname__}" if owner is not None \
                    else "missing"
                return (f"not written in the notebook: {name}.{method} is {where}, not defined in the "
                        f"exercise cell (write the method in your class)")
        return None
    code = _code_of(obj)
    if not _from_notebook(code):
        named = getattr(obj, "fn", obj)                   # a Triton kernel: its Python function
        origin = getattr(named, "__module__", None) or _where(code)
        return (f"not written in the notebook: {name} is {origin}.{getattr(named, '__qualname__', name)} "
                f"(defined in {_where(code)}), not code of the exercise cell")
    return None


CALLS = ("calls the package's answer {}: the exercise is to write it, not to call it (write it in the "
         "exercise cell, with torch and the lesson's given utilities)")


def _message(e: BaseException) -> str:
    if isinstance(e, AssertionError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def main() -> int:
    job = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")     # the verdict's own stdout
    os.dup2(2, 1)                                         # the student's prints go to stderr
    sys.stdout = sys.stderr
    nonce = job.pop("nonce")
    import torch
    if not torch.cuda.is_available():                     # as lesson 08's first cell: Triton interprets on a CPU
        os.environ["TRITON_INTERPRET"] = "1"

    import minillm.checks as checks
    from minillm.checks import harness
    graders = {c["grader"]: getattr(checks, c["grader"]) for c in job["checks"]}
    hidden = []
    if job.get("extra"):
        extra = job["extra"]
        if extra.get("folder"):
            sys.path.insert(0, extra["folder"])
        module = importlib.import_module(extra["module"])
        hidden = [(name, getattr(module, name)) for name in extra["functions"]]
    for check in job["checks"]:                          # the references, as the graders find them
        target = harness.REFERENCES.get(check["grader"], "minillm:__name__")
        try:
            importlib.import_module(target.split(":")[0])
        except Exception:
            pass
    snap = _snapshot()
    guard = AnswerGuard()                                 # before any student code (answers.py)
    for check in job["checks"]:
        guard.install(check["exercise"], check["grader"], [m for ms in check["objects"].values() for m in ms or []])
    job_results = []

    tampered: dict[str, list[str]] = {}

    def note_tampering(cell):                             # after each exercise cell ran
        changed = _changed(snap)
        if changed:
            for exercise in cell["exercises"]:
                tampered.setdefault(exercise, []).extend(changed)

    ns, failed = run_cells(job, after_cell=note_tampering)
    sys.stdout = sys.stderr

    for check in job["checks"]:
        exercise = check["exercise"]
        if exercise in tampered:
            job_results.append((exercise, False, "tampering: the exercise cell replaced "
                                + ", ".join(dict.fromkeys(tampered[exercise]))))
            continue
        if exercise in failed:
            job_results.append((exercise, False, failed[exercise]))
            continue
        args, why = [], None
        for name in check["args"]:
            if name not in ns:
                why = (f"not written in the notebook: the exercise cell does not define {name} "
                       "(write it in the exercise cell)")
                break
            if name in check["objects"]:
                why = why or authorship(name, ns[name], check["objects"][name])
            args.append(ns[name])
        named = None if why else guard.named_in(exercise, [ns[n] for n in check["objects"] if n in ns])
        if why or named:
            job_results.append((exercise, False, why or CALLS.format(named)))
            continue
        guard.watching = exercise
        try:
            graders[check["grader"]](*args)
            job_results.append((exercise, True, ""))
        except BaseException as e:
            job_results.append((exercise, False, _message(e)))
        guard.watching = None
        if exercise in guard.hits:
            job_results[-1] = (exercise, False, CALLS.format(guard.hits[exercise]))
        changed = _changed(snap)
        if changed:                                       # the student's code ran inside the grader
            job_results[-1] = (exercise, False, "tampering: while it was checked, the exercise replaced "
                               + ", ".join(changed))
            tampered.setdefault(exercise, []).extend(changed)
    for name, fn in hidden:
        label = job["extra"]["labels"][name]
        if tampered:
            job_results.append((label, False, "tampering found in the exercise cells ("
                                + "; ".join(f"{e}: {', '.join(dict.fromkeys(w))}" for e, w in tampered.items())
                                + "), so hidden checks do not run"))
            continue
        try:
            fn(ns)
            job_results.append((label, True, ""))
        except BaseException as e:
            job_results.append((label, False, _message(e)))
        _changed(snap)
    out.write(nonce + json.dumps([{"exercise": e, "passed": p, "message": m} for e, p, m in job_results]) + "\n")
    out.flush()
    os._exit(0)                                           # no student atexit hook or thread runs after


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        os._exit(3)
