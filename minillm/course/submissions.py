"""What a class submitted: `find_submissions(folder)` reads a submissions folder in either
layout `grade.py` takes (`alice/03_paged_kv.ipynb`, or `alice__03_paged_kv.ipynb`) into one
`Submission` (student, lesson number, notebook path) per notebook."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FLAT_NAME = re.compile(r"^(?P<student>.+?)__(?P<lesson>\d\d)_.*\.ipynb$")
FOLDER_NAME = re.compile(r"^(?P<lesson>\d\d)_.*\.ipynb$")


class GradingError(RuntimeError):
    """The grading run itself failed (not a student's notebook)."""


@dataclass
class Submission:
    student: str
    lesson: str
    path: Path


def find_submissions(folder: Path, lessons: list[str] | None = None) -> list[Submission]:
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingError(f"no submissions folder {folder}")
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and FLAT_NAME.match(entry.name):
            m = FLAT_NAME.match(entry.name)
            found.append(Submission(m["student"], m["lesson"], entry))
        elif entry.is_dir() and not entry.name.startswith("."):
            for nb in sorted(entry.glob("*.ipynb")):
                m = FOLDER_NAME.match(nb.name)
                if m:
                    found.append(Submission(entry.name, m["lesson"], nb))
    found = [s for s in found if lessons is None or s.lesson in lessons]
    if not found:
        raise GradingError(f"no submitted notebooks in {folder} (expected <student>/NN_name.ipynb or "
                           f"<student>__NN_name.ipynb{', for lessons ' + ','.join(lessons) if lessons else ''})")
    return found
