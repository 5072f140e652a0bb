"""Every lesson makes the student think before it tells. The course's design asks for "a design
question the student answers before the recipe, the recipe behind a collapsible hint ... it ends
with reflection questions and one open extension":

  - each exercise's markdown (from a heading "Exercise ..." to the exercise's code cell) asks a
    **Design question** and keeps the recipe behind a `<details><summary>Hint ...` block;
  - the lesson has a "## Questions" (or "## Reflect") cell with 2-4 numbered questions and an
    **Extension.**;
  - its answer key is a markdown cell tagged `minillm-answers`, which the build keeps out of lessons/.
One test per lesson, so a lesson's gap names that lesson alone.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from minillm.course.build import ANSWERS_TAG

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))


def markdown_cells(path):
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "markdown"]


def exercise_texts(path) -> list[tuple[str, str]]:
    """(id of the cell with an "Exercise" heading, the markdown from that heading to the exercise's
    code cell, the one holding a solution)."""
    cells = nbformat.read(str(path), as_version=4).cells
    found, current = [], None
    for cell in cells:
        heading = re.search(r"^#+ Exercise", cell.source, re.M) if cell.cell_type == "markdown" else None
        if heading:
            current = [cell.get("id"), cell.source[heading.start():]]
            found.append(current)
        elif current and cell.cell_type == "markdown":
            current[1] += "\n\n" + cell.source
        elif cell.cell_type == "code" and "# BEGIN SOLUTION" in cell.source:
            current = None
    return [tuple(f) for f in found]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_each_exercise_asks_a_design_question_before_its_hint(path):
    exercises = exercise_texts(path)
    assert exercises, f"{path.name}: no markdown cell with an 'Exercise' heading"
    for cell_id, source in exercises:
        question, hint = source.find("Design question"), source.find("<details><summary>Hint")
        assert 0 <= question < hint, (f"{path.name} cell {cell_id}: an exercise asks a 'Design question' "
                                      "before its recipe, and the recipe sits behind <details><summary>Hint")
        assert source.count("<details>") == source.count("</details>")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_lesson_ends_with_questions_an_extension_and_a_hidden_answer_key(path):
    cells = markdown_cells(path)
    heading = re.compile(r"^## (?:Questions|Reflect\w*)\s*$", re.M)
    questions = [c for c in cells if heading.search(c.source)]
    assert len(questions) == 1, f"{path.name}: one '## Questions' (or '## Reflect') cell at the lesson's end"
    text = questions[0].source[heading.search(questions[0].source).end():]
    numbered = re.findall(r"^\d\. ", text.split("**Extension.**")[0], re.M)
    assert 2 <= len(numbered) <= 4, f"{path.name}: 2-4 numbered reflection questions, found {len(numbered)}"
    assert "**Extension.**" in text, f"{path.name}: one open extension, as '**Extension.** ...'"
    keys = [c for c in cells if ANSWERS_TAG in c.metadata.get("tags", [])]
    assert keys, f"{path.name}: an answer key, a markdown cell tagged {ANSWERS_TAG!r}"
    lesson = REPO / "lessons" / path.name
    assert not any(ANSWERS_TAG in c.metadata.get("tags", []) or c.source == keys[0].source
                   for c in nbformat.read(str(lesson), as_version=4).cells), f"lessons/{path.name} shows the answer key"
