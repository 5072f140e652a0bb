"""Grade a class: `python -m minillm.course grade SUBMISSIONS`.

SUBMISSIONS is a folder that holds, for each student, either
  - a folder named after the student with their lesson notebooks, named as in lessons/
    (`alice/03_paged_kv.ipynb`; any name starting with the lesson's two digits and `_`), or
  - notebooks named `<student>__<NN>_<anything>.ipynb` (`alice__03_paged_kv.ipynb`).
Both layouts may be mixed.

Each notebook runs in its own process (pytest + nbval in lax mode: every cell runs, outputs
are not compared) with a timeout, as the learner ran it; nbval's tags and marker comments
(`raises-exception`, `nbval-skip`, `# NBVAL_SKIP`, ...) are stripped from every cell first.
Every check cell of the lesson (found by the id and tag the course build writes:
`check-<exercise>`, `minillm-check`) grades one exercise:
  - passed: the check cell is the course's (source and tags), it ran and passed, no other cell
    before it raised, and the verdict outside the kernel (below) passed too;
  - failed with the check's message (its hint), or with "check cell missing" / "check cell
    modified" (its code, tags or nbval metadata differ from the course's), "the notebook raised
    before this check" (with the first such error), "timed out", "notebook could not be read",
    "tampering: ..." or "not written in the notebook: ...".

The boundary: verdicts come from outside the student's kernel. Whatever the kernel printed,
the grade is decided in a fresh `python -m minillm.course.verdict` process (no IPython) that
imports the graders and the hidden checks BEFORE any student code and keeps its own
references to them, runs the lesson's import statements and then only the student's exercise
cells (the cells whose solution the build stubs, found by cell id), then every check, visible
and hidden, and sends the verdicts back as JSON on its stdout. Code in other cells of the
notebook never runs there, so it cannot reach a verdict (a monkeypatched grader,
`set_custom_exc`, `input_transformers_post`, a `raises-exception` tag all stay in the kernel).
An exercise is reported as tampering when its exercise cell touches the grading machinery:
a static `ast` scan (`tamper_scan.scan`: `minillm.checks` internals or `minillm.course`, IPython
hooks such as `get_ipython`, `set_custom_exc`, `input_transformers_*`, `sys.modules`, frame,
`gc` or `ctypes` introspection, nbval metadata, assignments to attributes of imported modules),
and an identity check after each exercise cell ran (and after each check) that the graders,
the package's functions and classes, `torch`'s and `builtins`' are still the originals (any
replaced one is put back). A graded object must be the student's own: a function's code comes
from a notebook cell, and a class defines every exercise method in the notebook (an import of
the package's answer or an empty subclass of it is "not written in the notebook"), and does not
merely call the package's answer while it is checked ("calls the package's answer ...": a call
from notebook code, however the answer was reached, is seen at run time; a Triton kernel's
code is read for it; `answers.py` says how). This stops
the known ways of faking a verdict; it is not a sandbox against code that goes looking for the
grader's process (the scan reports the introspection that would need).

`--extra-checks MODULE` (a dotted module name, or a .py file) adds hidden checks: each
function `lessonNN_<name>(namespace)` of the module runs in the verdict process, after the
student's exercise cells, with `namespace` the names those cells and the lesson's imports
define (not variables of other cells: build what a check needs inside it, e.g. with
`minillm.checks.harness.tiny_model()`); it fails by raising (AssertionError with a message),
and is reported as the exercise `<name> (extra)`, counted apart in the table
(`3/3 + 2/2 hidden`). Hidden checks do not run when an exercise cell was found tampering.

The exit status is 0 whatever the grades; 2 when the grading itself fails (no such folder,
no notebook, a notebook nbval could not even start).

A student gets the verdicts of one notebook from the same function (`grade_notebook`):
`python -m minillm.course self-check NOTEBOOK` (`self_check.py`).
"""
from __future__ import annotations

import importlib.util
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from .build import CHECK_TAG, exercise_of, make_lesson, read, solution_paths
from .check_cells import check_cell_differs, prepare
from .isolate import finish_verdicts, module_names, plan, start_verdicts, student_cells
from .tamper_scan import scan
from .report import Record, table, write_csv, write_json
from .run_notebook import run_notebook
from .submissions import GradingError, Submission, find_submissions
from . import sandbox

SANDBOX_FAILURES: list[tuple[str, str, str]] = []      # (student, lesson, how its sandbox failed)

EXTRA_PREFIX = re.compile(r"^lesson(?P<lesson>\d\d)_(?P<name>\w+)$")


def expected_lessons(root: Path, numbers=None) -> dict[str, object]:
    """lesson number -> the lesson notebook the build writes (its check cells are the reference),
    for the lessons `numbers` only when given (building one costs a read and a deep copy)."""
    return {p.name[:2]: make_lesson(read(p), f"solutions/{p.name}") for p in solution_paths(root)
            if numbers is None or p.name[:2] in numbers}


def check_cells(nb) -> list[tuple[str, object]]:
    return [(exercise_of(c), c) for c in nb.cells if exercise_of(c)]


def load_extra_checks(spec: str | None) -> tuple[dict[str, list[str]], str | None, str | None]:
    """(lesson -> function names, module name, folder to put on sys.path) for --extra-checks."""
    if not spec:
        return {}, None, None
    path = Path(spec)
    if path.suffix == ".py" and path.is_file():
        name, folder = path.stem, str(path.resolve().parent)
        sys.path.insert(0, folder)
    else:
        name, folder = spec, None
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise GradingError(f"--extra-checks {spec}: cannot import it ({e})") from e
    finally:
        if folder:
            sys.path.remove(folder)
    by_lesson: dict[str, list[str]] = {}
    for attr in sorted(vars(module)):
        m = EXTRA_PREFIX.match(attr)
        if m and callable(getattr(module, attr)):
            by_lesson.setdefault(m["lesson"], []).append(attr)
    if not by_lesson:
        raise GradingError(f"--extra-checks {spec}: no function named lessonNN_<name>(namespace)")
    return by_lesson, name, folder


def grade_notebook(sub: Submission, lesson, timeout: float, extra: dict, module: str | None,
                   folder: str | None) -> list[Record]:
    expected = check_cells(lesson)
    extra_names = extra.get(sub.lesson, [])
    exercises = [e for e, _ in expected] + [f"{EXTRA_PREFIX.match(n)['name']} (extra)" for n in extra_names]

    def every(message: str) -> list[Record]:
        return [Record(sub.student, sub.lesson, e, False, message) for e in exercises]

    try:
        submitted = nbformat.read(str(sub.path), as_version=4)
    except Exception as e:  # not JSON, not a notebook
        return every(f"notebook could not be read: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    nb = prepare(submitted)
    original = {i: c for i, c in enumerate(c for c in submitted.cells if c.cell_type == "code")}
    code = [c for c in nb.cells if c.cell_type == "code"]
    position = {id(c): i for i, c in enumerate(code)}
    checks = {c.get("id"): position[id(c)] for c in code if c.get("id", "").startswith("check-")}

    # the verdicts outside the kernel: the exercise cells again, in a plain Python of the grader's
    the_plan = plan(lesson)
    cells = student_cells(the_plan, code)
    given = module_names(the_plan.prelude)
    tampering = {}                              # exercise -> what the static scan found
    for cell in cells:
        course_imports = set().union(*(the_plan.given.get(i, set()) for i in cell["course"]))
        found_here = scan(cell["source"], given, course_imports)
        for exercise in cell["exercises"] if found_here else []:
            tampering.setdefault(exercise, []).extend(found_here)
    hidden = {"module": module, "folder": folder, "functions": extra_names,
              "labels": {n: f"{EXTRA_PREFIX.match(n)['name']} (extra)" for n in extra_names}} if extra_names else None

    found = {}                                  # exercise -> code index, or the reason it is not graded
    for exercise, cell in expected:
        mine = next((c for c in code if c.get("id") == cell.id), None)
        if mine is None:
            mine = next((c for c in code if CHECK_TAG in c.metadata.get("tags", [])
                         and exercise_of(c) == exercise), None)
        if mine is None:
            found[exercise] = "check cell missing: the cell that runs check_{} was deleted".format(exercise)
        elif check_cell_differs(original[position[id(mine)]], cell):
            found[exercise] = "check cell modified: the cell that runs check_{} was edited ({})".format(
                exercise, check_cell_differs(original[position[id(mine)]], cell))
        else:
            found[exercise] = position[id(mine)]
    check_positions = {i for i in found.values() if isinstance(i, int)} | set(checks.values())

    if not code:                                # nothing to run: every check cell is missing
        return [Record(sub.student, sub.lesson, e, False, found[e] if isinstance(found[e], str) else
                       "not run: the notebook has no code cell") for e in exercises]
    ends, running, output, timed_out = run_notebook(nb, timeout, folder)
    if not ends and not timed_out:
        raise GradingError(f"{sub.path}: nbval did not run the notebook; pytest said:\n{output[-2000:]}")

    # the verdicts outside the kernel, for what the kernel's run did not already fail (and the
    # hidden checks): the exercise cells again, in a plain Python of the grader's own
    def kernel_passed(exercise) -> bool:
        at = found.get(exercise)
        return (isinstance(at, int) and exercise not in tampering and ends.get(at, {}).get("passed", False)
                and not any(not ends[i]["passed"] for i in ends if i < at and i not in check_positions))
    wanted = [c for c in the_plan.checks if kernel_passed(c.exercise)]
    verdicts, no_verdicts = {}, None
    if wanted or hidden:
        verdicts, no_verdicts = finish_verdicts(*start_verdicts(the_plan, cells, hidden, wanted), timeout)

    records = []
    for exercise in exercises:
        at = found.get(exercise)
        if exercise.endswith(" (extra)"):
            passed, message = verdicts.get(exercise, (False, no_verdicts or "hidden check not run"))
            records.append(Record(sub.student, sub.lesson, exercise, passed, message))
            continue
        if exercise in tampering and not isinstance(at, str):
            records.append(Record(sub.student, sub.lesson, exercise, False, "tampering: the exercise cell "
                                  "reaches the grading machinery: " + ", ".join(dict.fromkeys(tampering[exercise]))))
            continue
        if isinstance(at, str):
            records.append(Record(sub.student, sub.lesson, exercise, False, at))
            continue
        earlier = [ends[i] for i in sorted(ends) if i < at and i not in check_positions and not ends[i]["passed"]]
        end = ends.get(at)
        if earlier and earlier[0].get("error") in ("Timeout", "NotRun") or (end is None and timed_out):
            where = f" (cell {running} was running)" if running is not None else ""
            records.append(Record(sub.student, sub.lesson, exercise, False,
                                  f"timed out: the notebook ran past its {timeout:g} s limit{where}"))
        elif end is None:
            records.append(Record(sub.student, sub.lesson, exercise, False, "not run: the notebook stopped "
                                  "before this check"))
        elif earlier:
            first = earlier[0]
            verdict = "its check then passed" if end["passed"] else f"its check then failed: {end['message']}"
            records.append(Record(sub.student, sub.lesson, exercise, False,
                                  f"the notebook raised before this check, in cell {first['cell']}: "
                                  f"{first['error']}: {first['message']} ({verdict})"))
        elif end["passed"]:
            passed, message = verdicts.get(exercise, (False, no_verdicts or "not graded: no exercise cell for "
                                                      "this check was found (its cell id or its definitions)"))
            records.append(Record(sub.student, sub.lesson, exercise, passed, message))
        elif end.get("error") == "Timeout":
            records.append(Record(sub.student, sub.lesson, exercise, False,
                                  f"timed out: the check ran past the notebook's {timeout:g} s limit"))
        else:
            message = end["message"] if end["error"] in ("CheckFailed", "AssertionError") else \
                f"{end['error']}: {end['message']}"
            records.append(Record(sub.student, sub.lesson, exercise, False, message))
    return records


# ---------------------------------------------------------------- a class

def grade(submissions: Path, root: Path = Path("."), lessons: list[str] | None = None, timeout: float = 600,
          extra_checks: str | None = None, jobs: int = 1) -> list[Record]:
    course = {p.name[:2] for p in solution_paths(root)}
    unknown = sorted(set(lessons or []) - course)
    if unknown:
        raise GradingError(f"no lesson {', '.join(unknown)} in {Path(root) / 'solutions'}")
    subs = find_submissions(submissions, lessons)
    subs = [s for s in subs if s.lesson in course]
    if not subs:
        raise GradingError(f"no submitted notebook is one of the lessons {', '.join(sorted(course))}")
    expected = expected_lessons(root, {s.lesson for s in subs})     # only the lessons handed in
    extra, module, folder = load_extra_checks(extra_checks)

    def one(sub):
        sandbox.failures()
        records = grade_notebook(sub, expected[sub.lesson], timeout, extra, module, folder)
        SANDBOX_FAILURES.extend((sub.student, sub.lesson, f) for f in dict.fromkeys(sandbox.failures()))
        return records

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, subs))
    return [r for rs in results for r in rs]


def default_root() -> Path:
    """The checkout to take the lessons from: the current folder when it has solutions/,
    else the one this package lives in."""
    here = Path(".")
    return here if (here / "solutions").is_dir() else Path(__file__).resolve().parents[2]


def main(args) -> int:
    t0 = time.perf_counter()
    lessons = [f"{int(x):02d}" for x in args.lessons.split(",")] if args.lessons else None
    root = args.root if args.root is not None else default_root()
    try:
        kind = sandbox.configure(getattr(args, "sandbox", "auto"))
    except sandbox.SandboxError as e:
        raise GradingError(str(e)) from None
    if kind == "none":
        print(sandbox.WARNING, file=sys.stderr)
    records = grade(args.submissions, root, lessons, args.timeout, args.extra_checks, args.jobs)
    # every sandbox is gone here: the grade files are written now, once, each atomically
    print(sandbox.report(table(records), SANDBOX_FAILURES))
    if args.csv:
        sandbox.write_atomically(args.csv, lambda path: write_csv(records, path))
    if args.json:
        sandbox.write_atomically(args.json, lambda path: write_json(sandbox.marked(records), path))
    n = len({(r.student, r.lesson) for r in records})
    print(f"\ngraded {n} notebook(s) in {time.perf_counter() - t0:.0f} s")
    return 0
