"""The grader's side of verdicts outside the student's kernel (see `grade.py` and `verdict.py`).

`plan(lesson)` reads, from the course's lesson notebook, what each check grades: its exercise
cells (the cells whose solution the build replaced by a stub), the objects its check cell
passes to the grader, and, for a class, the exercise methods (those stubbed in the lesson).
`scan(source)` (from `tamper_scan.py`) is the static part of the tampering rule.
`run_verdicts(...)` starts `python -m minillm.course.verdict` on a submission's exercise cells.
"""
from __future__ import annotations

import ast
import json
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .build import SETUP_ID, STUB, exercise_of
from .tamper_scan import cell_imports as _imports, import_keys, parse, python_source

@dataclass
class Check:
    exercise: str
    grader: str
    args: list[str]
    objects: dict[str, list[str] | None] = field(default_factory=dict)   # graded name -> exercise methods


@dataclass
class Plan:
    checks: list[Check]
    cells: dict[str, list[str]]            # exercise cell id -> the exercises it defines objects for
    names: dict[str, set[str]]             # exercise cell id -> top-level names it defines
    prelude: list[str]                     # the lesson's own import statements
    given: dict[str, set] = field(default_factory=dict)   # exercise cell id -> the imports the course's cell holds


def _defined(tree) -> dict[str, ast.AST]:
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))} if tree else {}


def _stubbed(node, lines: list[str]) -> bool:
    return any(STUB[1] in line for line in lines[node.lineno - 1:node.end_lineno])


def plan(lesson) -> Plan:
    checks, cells, names, prelude, objects, given = [], {}, {}, [], {}, {}
    for cell in lesson.cells:
        if cell.cell_type != "code" or cell.get("id") == SETUP_ID:
            continue
        exercise = exercise_of(cell)
        tree = parse(cell.source)
        if exercise:
            call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                         and n.func.id == f"check_{exercise}"), None) if tree else None
            args = [a.id for a in call.args if isinstance(a, ast.Name)] if call else []
            checks.append(Check(exercise, f"check_{exercise}", args))
        elif STUB[1] in cell.source:
            lines = python_source(cell.source).split("\n")
            names[cell.id] = set(_defined(tree))
            for name, node in _defined(tree).items():
                if isinstance(node, ast.ClassDef):
                    objects[name] = [m.name for m in node.body
                                     if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and _stubbed(m, lines)]
                elif _stubbed(node, lines):
                    objects[name] = None
            cells[cell.id] = []
            given[cell.id] = import_keys(tree)
        elif tree:
            prelude += [ast.unparse(n) for n in _imports(tree.body)]
    for check in checks:
        check.objects = {a: objects[a] for a in check.args if a in objects}
        for cell_id in cells:
            if names[cell_id] & set(check.args):
                cells[cell_id].append(check.exercise)
    return Plan(checks, cells, names, prelude, given)


def module_names(prelude: list[str], every: bool = False) -> set[str]:
    """The names import statements bind: modules, and what is imported from the package (every
    name imported, with every=True)."""
    names = set()
    for source in prelude:
        for node in ast.parse(source).body:
            if isinstance(node, ast.Import):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (every or (node.module or "").startswith("minillm")):
                names.update(a.asname or a.name for a in node.names)
    return names


# ---------------------------------------------------------------- the run

def student_cells(the_plan: Plan, code: list) -> list[dict]:
    """The submission's exercise cells, in notebook order: by the course's cell id, else (a cell
    the student re-created) the code cell that defines the exercise's names."""
    chosen, course = {}, {}
    for cell_id, exercises in the_plan.cells.items():
        at = next((i for i, c in enumerate(code) if c.get("id") == cell_id), None)
        if at is None:
            wanted = the_plan.names[cell_id]
            at = next((i for i in range(len(code) - 1, -1, -1)
                       if not exercise_of(code[i]) and wanted & set(_defined(parse(code[i].source)))), None)
        if at is not None:
            chosen.setdefault(at, []).extend(exercises)
            course.setdefault(at, []).append(cell_id)
    return [{"index": i, "source": python_source(code[i].source), "exercises": chosen[i], "course": course[i]}
            for i in sorted(chosen)]


def needed_imports(prelude: list[str], cells: list[dict]) -> list[str]:
    """The lesson's import statements that bind a name the exercise cells use (importing
    matplotlib or the server for a cell that needs only torch would cost every notebook a
    second); a cell that does not parse keeps them all."""
    used = set()
    for cell in cells:
        tree = parse(cell["source"])
        if tree is None:
            return prelude
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return [source for source in prelude if module_names([source], every=True) & used]


def start_verdicts(the_plan: Plan, cells: list[dict], extra: dict | None, checks: list[Check] | None = None):
    """Start the verdict process for `checks` (default: all of the plan's); returns (process,
    work folder, nonce)."""
    work = Path(tempfile.mkdtemp(prefix="minillm-verdict-"))
    nonce = secrets.token_hex(16)
    checks = the_plan.checks if checks is None else checks
    job = {"nonce": nonce, "prelude": needed_imports(the_plan.prelude, cells), "cells": cells,
           "checks": [{"exercise": c.exercise, "grader": c.grader, "args": c.args, "objects": c.objects}
                      for c in checks], "extra": extra}
    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with open(work / "job.json", encoding="utf-8") as stdin:
        # in a sandbox, the judge (outside it) decides, starting the student's side in sandboxes (judge.py)
        from .sandbox import current
        module = "minillm.course.judge" if current() != "none" else "minillm.course.verdict"
        proc = subprocess.Popen([sys.executable, "-m", module], cwd=work, env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, work, nonce


def finish_verdicts(proc, work: Path, nonce: str, timeout: float) -> tuple[dict[str, tuple[bool, str]], str | None]:
    """(exercise -> (passed, message), why there are no verdicts or None)."""
    import shutil

    from .run_notebook import _kill_tree
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            return {}, f"timed out: grading the exercise cells again ran past the {timeout:g} s limit"
        line = next((x for x in reversed(stdout.splitlines()) if x.startswith(nonce)), None)
        if line is None:
            tail = " | ".join(stderr.strip().splitlines()[-3:])[-300:]
            return {}, f"the exercise cells, run again for grading, ended the process (exit {proc.returncode}): {tail}"
        return {r["exercise"]: (r["passed"], r["message"]) for r in json.loads(line[len(nonce):])}, None
    finally:
        shutil.rmtree(work, ignore_errors=True)
