"""Check your own notebook: `python -m minillm.course self-check lessons/03_paged_kv.ipynb`.

It grades that one notebook exactly as the instructor's `python -m minillm.course grade` will:
the same function (`grade.grade_notebook`), so the same verdicts and hints. That means the
whole notebook runs in a fresh kernel under nbval (as Kernel > Restart & Run All would), then
your exercise cells run again in a plain Python process that holds the checks (see `grade.py`),
in the grading sandbox where grade would use one (`sandbox.py`, `--sandbox auto`).
The kernel run cannot be skipped without changing verdicts: a cell that raises before a check,
an edited check cell or a notebook that runs past its time limit fails that check when graded,
whatever the exercise cell holds. So it takes as long as running your notebook top to bottom,
plus a few seconds; save the notebook first (it reads the file, not the open kernel).

It prints one line per exercise (passed, or FAILED with its message's first line and hint),
then each failure's whole message. Exit status: 0 when every exercise passes, 1 when one
fails, 2 when it cannot grade (no such file, a name that says no lesson).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from . import sandbox
from .build import make_lesson, read
from .grade import default_root, grade_notebook
from .submissions import GradingError, Submission
from .report import Record, first_line, write_json

LESSON = re.compile(r"^(\d\d)_.*\.ipynb$")
GRADING = "MINILLM_GRADE_RECORD"           # set by run_notebook for the kernel of a notebook being graded


def lesson_notebook(root: Path, number: str):
    """The course's lesson notebook `number` (its check cells are the reference), from solutions/."""
    found = sorted((Path(root) / "solutions").glob(f"{number}_*.ipynb"))
    if not found:
        raise GradingError(f"no lesson {number} in {Path(root) / 'solutions'}")
    return make_lesson(read(found[0]), f"solutions/{found[0].name}")


def self_check(path: Path, root: Path, lesson: str | None = None, timeout: float = 600) -> list[Record]:
    path = Path(path)
    if not path.is_file():
        raise GradingError(f"no notebook {path}")
    if lesson is None:
        m = LESSON.match(path.name)
        if not m:
            raise GradingError(f"{path.name}: the name does not start with a lesson's number (as "
                               "03_paged_kv.ipynb does); say which lesson with --lesson 03")
        lesson = m[1]
    lesson = f"{int(lesson):02d}"
    return grade_notebook(Submission("you", lesson, path), lesson_notebook(root, lesson), timeout, {}, None, None)


def report(records: list[Record], path: Path) -> str:
    if not records:
        return f"self-check of {path}: this lesson has no exercise to check"
    width = max(len("exercise"), *(len(r.exercise) for r in records))
    lines = [f"self-check of {path} (lesson {records[0].lesson}): the verdicts `grade` gives", "",
             f"{'exercise'.ljust(width)}  result"]
    lines += [f"{r.exercise.ljust(width)}  " + ("passed" if r.passed else f"FAILED  {first_line(r.message)}")
              for r in records]
    failed = [r for r in records if not r.passed]
    for r in failed:
        lines += ["", f"{r.exercise}:", *("    " + line for line in r.message.strip().split("\n"))]
    lines += ["", f"{len(records) - len(failed)}/{len(records)} exercises pass"]
    return "\n".join(lines)


def main(args) -> int:
    if os.environ.get(GRADING):
        # a self-check cell inside a notebook being graded (or self-checked) would run that
        # notebook again, and again inside that run: it does nothing there
        print("self-check: skipped, this notebook is being graded or self-checked right now")
        return 0
    t0 = time.perf_counter()
    root = args.root if args.root is not None else default_root()
    try:                                  # where grade would run it (sandbox.py): the same verdicts
        sandbox.configure(getattr(args, "sandbox", "auto"))
    except sandbox.SandboxError as e:
        raise GradingError(str(e)) from None
    sandbox.failures()
    records = self_check(args.notebook, root, args.lesson, args.timeout)
    print(report(records, args.notebook))
    for failure in dict.fromkeys(sandbox.failures()):      # as grade lists them under its table
        print(f"the grading sandbox: {failure}")
    print(f"(checked in {time.perf_counter() - t0:.0f} s)")
    if args.json:
        write_json(records, args.json)
    return 0 if all(r.passed for r in records) else 1
