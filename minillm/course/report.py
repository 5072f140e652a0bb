"""The grading report: a student × lesson table, and CSV / JSON records for a gradebook."""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Record:
    student: str
    lesson: str
    exercise: str
    passed: bool
    message: str


def first_line(message: str, width: int = 150) -> str:
    """The message's first line and, when a later line is its hint (`Hint: ...`, as lesson 08's
    checks give), that line too: the table's one line per failed exercise."""
    lines = [line.strip() for line in message.strip().split("\n")]
    hint = next((line for line in lines[1:] if line.startswith("Hint:")), None)
    line = lines[0] + (f" | {hint}" if hint else "")
    width = width + 100 if hint else width
    return line if len(line) <= width else line[: width - 1] + "…"


HIDDEN = " (extra)"       # how grade.py names the exercise of a hidden check


def score(rs: list[Record]) -> str:
    """`3/3`, or with hidden checks `3/3 + 2/2 hidden` (the lesson's checks, then the hidden ones)."""
    shown = [r for r in rs if not r.exercise.endswith(HIDDEN)]
    hidden = [r for r in rs if r.exercise.endswith(HIDDEN)]
    text = f"{sum(r.passed for r in shown)}/{len(shown)}"
    return text + (f" + {sum(r.passed for r in hidden)}/{len(hidden)} hidden" if hidden else "")


def table(records: list[Record]) -> str:
    """student × lesson: passed / total (hidden checks apart: `3/3 + 2/2 hidden`); then, per
    failed exercise, its first failure's message (first line, and its `Hint:` line)."""
    students = list(dict.fromkeys(r.student for r in records))
    lessons = sorted({r.lesson for r in records})
    cell = {}
    for s in students:
        for lesson in lessons:
            rs = [r for r in records if r.student == s and r.lesson == lesson]
            cell[s, lesson] = score(rs) if rs else "-"
    width = max(len("student"), *(len(s) for s in students))
    columns = {lesson: max(6, *(len(cell[s, lesson]) for s in students)) for lesson in lessons}
    lines = ["student".ljust(width) + "".join(f"  {lesson:>{columns[lesson]}}" for lesson in lessons)]
    for s in students:
        lines.append(s.ljust(width) + "".join(f"  {cell[s, lesson]:>{columns[lesson]}}" for lesson in lessons))
    failed = [r for r in records if not r.passed]
    if failed:
        lines += ["", "failed exercises (first failure's hint):"]
        lines += [f"  {r.student} {r.lesson} {r.exercise}: {first_line(r.message)}" for r in failed]
    return "\n".join(lines)


def write_csv(records: list[Record], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["student", "lesson", "exercise", "passed", "message"])
        writer.writeheader()
        writer.writerows(asdict(r) for r in records)


def write_json(records: list[Record], path: Path) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in records], indent=1, ensure_ascii=False) + "\n",
                          encoding="utf-8")


