"""The generated class of tests/test_grade.py covers the whole course (fast: no notebook runs
here), and the grader's static scan tells a lesson's own imports from tampering."""
import pytest

from grading_class import (EXERCISES, LESSONS, PLANTED, bound_names, checks_seeing, global_names, honest, lean,
                           planted, planted_submission, stubbed_cells, trim)
from minillm.course.build import STUB, exercise_of
from minillm.course.isolate import plan
from minillm.course.tamper_scan import STUDENT_IMPORTS, import_keys, parse, scan


def test_every_lesson_has_exercises_and_every_exercise_has_a_planted_bug():
    """Exercises are found from the lessons' check cells: a new exercise fails here until
    grading_class.PLANTED gives it a mistake of its own."""
    assert set(LESSONS) == {f"{n:02d}" for n in range(14)} and set(EXERCISES) == set(LESSONS)
    every = [e for exercises in EXERCISES.values() for e in exercises]
    assert len(every) == len(set(every))
    missing = sorted(set(every) - set(PLANTED))
    assert not missing, f"exercises without a planted bug in tests/grading_class.py PLANTED: {missing}"
    assert not set(PLANTED) - set(every), f"planted bugs for no exercise: {sorted(set(PLANTED) - set(every))}"
    assert all(PLANTED[e][0] == n for n, exercises in EXERCISES.items() for e in exercises)


@pytest.mark.parametrize("number", list(LESSONS))
def test_honest_student_fills_every_stub(number):
    nb = honest(number)
    cells = [c for c in nb.cells if c.get("id") in stubbed_cells(number)]
    assert cells and not any(STUB[1] in c.source or STUB[0] in c.source for c in cells)


@pytest.mark.parametrize("exercise", list(PLANTED))
def test_planted_bug_changes_one_exercise_cell(exercise):
    number = PLANTED[exercise][0]
    before, after = honest(number), planted(exercise)
    changed = [a.get("id") for b, a in zip(before.cells, after.cells) if a.source != b.source]
    assert len(changed) == 1 and changed[0] in stubbed_cells(number)


@pytest.mark.parametrize("number", list(LESSONS))
def test_lean_imports_cell_binds_every_name_the_other_cells_read(number):
    """grading_class.lean cuts a submission's imports cell: every name it bound that a kept cell
    reads is still bound (the cut notebook runs as the whole one did), and the model is loaded
    only where a kept cell uses it (lessons 10 to 12's exercises do not)."""
    import ast
    nb = trim(honest(number), number)
    whole = ast.parse(nb.cells[2].source)
    cut = lean(trim(honest(number), number))
    read = set().union(*(global_names(c.source) for c in cut.cells[3:] if c.cell_type == "code"))
    before = set().union(*map(bound_names, whole.body))
    after = set().union(*map(bound_names, ast.parse(cut.cells[2].source).body))
    assert (before & read) <= after, sorted((before & read) - after)
    assert ("load_model(" in cut.cells[2].source) == bool({"model", "tokenizer"} & read)
    assert len(cut.cells[2].source) <= len(nb.cells[2].source)


def test_planted_submission_holds_the_checks_that_can_see_its_bug():
    """A planted-bug student's notebook keeps the check cells of its exercise and of those whose
    cells use what it defines (lesson 01: sample calls apply_top_k and apply_top_p, generate_naive
    calls sample); the others are deleted, the exercise cells all stay."""
    assert checks_seeing("top_k") == {"top_k", "sampler", "generate_naive"}
    assert checks_seeing("sampler") == {"sampler", "generate_naive"}
    assert checks_seeing("generate_naive") == {"generate_naive"}
    for exercise, (number, _, new, _) in PLANTED.items():
        nb = planted_submission(exercise)
        assert {exercise_of(c) for c in nb.cells if exercise_of(c)} == checks_seeing(exercise)
        assert stubbed_cells(number) <= {c.get("id") for c in nb.cells}
        assert any(new in c.source for c in nb.cells if c.get("id") in stubbed_cells(number))


def test_scan_lets_a_lessons_own_imports_pass():
    """Lesson 07's exercise cell imports DetokenizerBase from minillm.checks.bases: the course's
    own import (and a base meant for students) is no tampering; the grading internals still are."""
    lesson = honest("07")
    the_plan = plan(__import__("grading_class").lesson("07"))
    cell = next(c for c in lesson.cells if c.get("id") == "a7c10014")
    course = the_plan.given["a7c10014"]
    assert ("from", "minillm.checks.bases", "DetokenizerBase") in course
    assert scan(cell.source, set(), course) == []
    assert scan("from minillm.checks.bases import DetokenizerBase\n") == []          # STUDENT_IMPORTS
    assert ("from", "minillm.checks.bases", "DetokenizerBase") in STUDENT_IMPORTS
    for tampering in ("from minillm.checks.harness import REFERENCES", "import minillm.checks.bases",
                      "from minillm.checks.bases import DetokenizerBase, __builtins__",
                      "from minillm.checks import harness", "import minillm.checks",
                      "from minillm.checks.bases import DetokenizerBase\nDetokenizerBase.add = lambda s, t: ''\n"):
        assert scan(tampering, set(), course), tampering
    # a course cell's import is allowed in that cell only
    assert scan("from minillm.text.detokenizer import REPLACEMENT_CHAR\n", set(), course) == []
    assert import_keys(parse("import a.b as c\nfrom .x import y")) == {("import", "a.b"), ("from", ".x", "y")}
