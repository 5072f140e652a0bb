"""Build the exercise notebooks (lessons/) from the solution notebooks (solutions/).

`solutions/NN_name.ipynb` is the single source of every lesson. In its code cells,
the answer to an exercise sits between two marker lines:

    def apply_rope(x, cos, sin):
        \"\"\"docstring the learner keeps\"\"\"
        # BEGIN SOLUTION
        ...the reference answer...
        # END SOLUTION

`build` copies each solution to `lessons/NN_name.ipynb`, replaces every marked block
(markers included) with a stub at the marker's indentation,

        # YOUR CODE HERE
        raise NotImplementedError("YOUR CODE HERE")

and clears outputs and execution counts. Output is written the same way every time,
so rebuilding gives byte-identical files and `check` can compare them.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = ("# YOUR CODE HERE", 'raise NotImplementedError("YOUR CODE HERE")')
NOTEBOOK_NAME = re.compile(r"^\d\d_.+\.ipynb$")
VOLATILE_CELL_METADATA = ("execution",)      # run timestamps written by JupyterLab
VOLATILE_NOTEBOOK_METADATA = ("widgets",)    # saved ipywidgets state


class MarkerError(ValueError):
    """A cell's solution markers do not pair up."""


def stub_source(source: str, where: str = "cell") -> str:
    """Replace each BEGIN/END SOLUTION block of `source` with the two-line stub."""
    out, begin_line = [], None
    for n, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if begin_line is not None:
                raise MarkerError(f"{where}: line {n} opens '{BEGIN}' again before "
                                  f"line {begin_line}'s block was closed with '{END}'")
            begin_line = n
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + stub for stub in STUB)
        elif marker == END:
            if begin_line is None:
                raise MarkerError(f"{where}: line {n} has '{END}' with no '{BEGIN}' before it")
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise MarkerError(f"{where}: '{BEGIN}' on line {begin_line} is never closed with '{END}'")
    return "\n".join(out)


def clear_outputs(nb):
    """Remove outputs, execution counts and run-dependent metadata, in place."""
    for key in VOLATILE_NOTEBOOK_METADATA:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def make_lesson(solution, name: str = "notebook"):
    """A solution notebook -> its lesson notebook (a new object; the input is not changed)."""
    lesson = clear_outputs(copy.deepcopy(solution))
    for i, cell in enumerate(lesson.cells):
        if cell.cell_type == "code":
            cell.source = stub_source(cell.source, f"{name}, cell {i} (id {cell.get('id', '?')})")
    return lesson


def render(nb) -> str:
    """The exact text written to disk: nbformat's stable JSON (sorted keys) + a newline."""
    return nbformat.writes(nb, version=4) + "\n"


def read(path: Path):
    return nbformat.read(str(path), as_version=4)


def write_text(path: Path, text: str) -> bool:
    """Write if the content changed; True when it did."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return True


def solution_paths(root: Path) -> list[Path]:
    folder = Path(root) / "solutions"
    if not folder.is_dir():
        raise FileNotFoundError(f"no solutions/ folder under {Path(root).resolve()}")
    return sorted(p for p in folder.iterdir() if NOTEBOOK_NAME.match(p.name))


def lesson_paths(root: Path) -> list[Path]:
    folder = Path(root) / "lessons"
    return sorted(p for p in folder.iterdir() if NOTEBOOK_NAME.match(p.name)) if folder.is_dir() else []


def expected_lessons(root: Path) -> dict[Path, str]:
    """lesson path -> the text `build` writes there."""
    return {Path(root) / "lessons" / s.name: render(make_lesson(read(s), f"solutions/{s.name}"))
            for s in solution_paths(root)}


def build(root: Path = Path(".")) -> tuple[list[Path], list[Path]]:
    """Write lessons/ from solutions/. Returns (lessons written, stale lessons removed)."""
    expected = expected_lessons(root)        # every notebook converts before anything is written
    written = [path for path, text in expected.items() if write_text(path, text)]
    removed = [path for path in lesson_paths(root) if path not in expected]
    for path in removed:
        path.unlink()
    return written, removed


def strip(root: Path = Path(".")) -> list[Path]:
    """Clear outputs from the solution notebooks in place. Returns the files changed."""
    return [path for path in solution_paths(root)
            if write_text(path, render(clear_outputs(read(path))))]


def check(root: Path = Path(".")) -> list[str]:
    """Problems that make the repo out of sync; an empty list means all is well."""
    problems = []
    for path in solution_paths(root):
        nb = read(path)
        if render(nb) != render(clear_outputs(read(path))):
            problems.append(f"{path.relative_to(root)}: carries outputs (run: python -m minillm.course strip)")
    expected = expected_lessons(root)
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{path.relative_to(root)}: missing (run: python -m minillm.course build)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.relative_to(root)}: differs from its solution "
                            "(edit solutions/, then run: python -m minillm.course build)")
    for path in lesson_paths(root):
        if path not in expected:
            problems.append(f"{path.relative_to(root)}: has no solution notebook "
                            "(run: python -m minillm.course build to remove it)")
    return problems
