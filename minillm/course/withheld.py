"""The package as the student's code sees it while graded from outside: answers withheld.

Where an exercise is graded outside the sandbox (`judge.py`), nothing inside needs its answer,
so the copy of the package the sandbox gets has that answer's body replaced by a stub that
raises "withheld while grading" (its signature and docstring stay, the rest of the package
runs). A thread, a subprocess, `multiprocessing`, a fresh module copy, an `exec` of the
package's source under a notebook label or relabelled code then reach the stub, not the answer.
"""
from __future__ import annotations

import ast
import atexit
import compileall
import hashlib
import shutil
import tempfile
import threading
from pathlib import Path

from .sandbox import PACKAGE_DIR

STUB = 'raise NotImplementedError("{name}: withheld while grading (the package\'s answer is not available to graded code)")'
_copies: dict[frozenset, Path] = {}
_lock = threading.Lock()


# graders whose exercise is a subclass of the package's class overriding some of its methods: only
# those methods are withheld (the student's class inherits the rest), with the package's other
# methods that answer the same question (lesson 06's Scheduler.schedule schedules as lesson 05 asks)
METHODS = {
    "check_scheduler": ("minillm.engine.scheduler:ContinuousBatchingScheduler.schedule",
                        "minillm.engine.scheduler:Scheduler.schedule", "minillm.engine.scheduler:Scheduler.keep_running",
                        "minillm.engine.scheduler:Scheduler.bring_in"),
    "check_preemption": ("minillm.engine.scheduler:Scheduler.pick_victim", "minillm.engine.scheduler:Scheduler._preempt"),
    "check_copy_on_write": ("minillm.kv.block_manager:BlockManager.append_slots",),
    "check_swap": ("minillm.kv.block_manager:BlockManager.swap_out", "minillm.kv.block_manager:BlockManager.swap_in"),
    "check_structured_outputs": ("minillm.structured.matchers:StructuredOutputs.mask_logits",
                                 "minillm.structured.matchers:StructuredOutputs.advance"),
    "check_request_stream": ("minillm.server.async_engine:RequestStream.deliver",
                             "minillm.server.async_engine:RequestStream._outputs",
                             "minillm.server.async_engine:RequestStream.abort"),
}


def _answers(graders: frozenset[str]) -> dict[str, list[str]]:
    """module (`minillm.kv.block_manager`) -> names (`f` or `Class.method`) to withhold."""
    from ..checks.harness import PART_ANSWERS, REFERENCES
    out: dict[str, list[str]] = {}
    for grader in sorted(graders):
        for dotted in METHODS.get(grader, (REFERENCES[grader],)) + tuple(PART_ANSWERS.get(grader, ())):
            module, attribute = dotted.split(":")
            out.setdefault(module, []).append(attribute)
    return out


def stub_out(source: str, names: list[str], module: str = "") -> str:
    """`source` with the body of each top-level function (or `Class.method`, or every method of a
    class) in `names` replaced by the stub, which names what was called (`module.Class.method`:
    a student who called the answer through super() or another name sees which one)."""
    tree = ast.parse(source)
    lines = source.split("\n")
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = item
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    names = [m for n in names for m in ([f"{n}.{i.name}" for i in classes[n].body if isinstance(
        i, (ast.FunctionDef, ast.AsyncFunctionDef))] if n in classes else [n])]      # a class: every method
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"cannot withhold {', '.join(missing)}: no such function in the module")
    for name, node in sorted(((n, found[n]) for n in set(names)), key=lambda x: -x[1].lineno):
        body = node.body
        keep = 1 if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str) else 0
        indent = " " * body[0].col_offset
        start = body[keep].lineno - 1 if keep < len(body) else body[-1].end_lineno
        end = body[-1].end_lineno
        lines[start:end] = [indent + STUB.format(name=f"{module}.{name}" if module else name)]
    return "\n".join(lines)


def package_without(graders: frozenset[str], under: Path | None = None) -> Path:
    """A copy of the package (its `minillm/` folder) with the answers of `graders` withheld,
    byte-compiled; made once per set of graders under `under` (shared by the processes of one
    grading run, file-locked), else in a temporary folder removed when this process exits."""
    from filelock import FileLock
    graders = frozenset(graders)
    key = hashlib.sha256(",".join(sorted(graders)).encode()).hexdigest()[:16]
    with _lock:
        if under is None:
            if graders not in _copies:
                _copies[graders] = Path(tempfile.mkdtemp(prefix="minillm-withheld-"))
                atexit.register(shutil.rmtree, _copies[graders], True)
            under = _copies[graders]
        root = Path(under) / key / "minillm"
        with FileLock(str(Path(under) / f"{key}.lock")):
            if not root.is_dir():
                building = Path(tempfile.mkdtemp(prefix=".building-", dir=under)) / "minillm"
                shutil.copytree(PACKAGE_DIR, building, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                for module, names in _answers(graders).items():
                    path = building / (module.split(".", 1)[1].replace(".", "/") + ".py")
                    path.write_text(stub_out(path.read_text(encoding="utf-8"), names, module), encoding="utf-8")
                compileall.compile_dir(str(building), quiet=1, workers=1)
                root.parent.mkdir(parents=True, exist_ok=True)
                building.rename(root)
                shutil.rmtree(building.parent, ignore_errors=True)
        return root
