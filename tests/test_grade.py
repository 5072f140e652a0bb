"""`python -m minillm.course grade` over a generated class: lessons 00, 03 and 04 (the fastest
to run), a student with the reference solutions (all pass), one with the stubs (all fail), one
wrong implementation per exercise (exactly that exercise fails, with its hint), a deleted and
an edited check cell, hidden checks (--extra-checks), and, in a second run with a short
timeout and the flat `student__NN_name.ipynb` layout, a notebook that hangs, one whose
imports fail and one that is not a notebook.

To keep the run short, submissions keep only the cells grading needs (the badge, the setup
cell, the imports, the exercises and their checks), as a student who deleted the rest
would; the full lessons run in the notebook tests.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minillm.course.build import exercise_of, make_lesson, read
from minillm.course.grade import Record, table

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

LESSONS = {"00": "00_setup_and_tour.ipynb", "03": "03_paged_kv.ipynb", "04": "04_prefix_sharing.ipynb"}
EXERCISES = {"00": ["rope"], "03": ["block_allocator", "slot_mapping"],
             "04": ["block_hash", "prefix_cache", "copy_on_write"]}

CHECKS_NEED = {"03": ["c05"]}          # lesson 03's slot_mapping check cell prints with this cell's `tables`

# exercise -> (lesson, text in the reference solution, a plausible mistake, words its hint must contain)
WRONG = {
    "rope": ("00", "torch.cat([-x2, x1], dim=-1)", "torch.cat([x2, -x1], dim=-1)", "rotates the wrong way"),
    "block_allocator": ("03", "            self.free_blocks[block] = None",
                        "            self.free_blocks[block] = None\n"
                        "            self.free_blocks.move_to_end(block, last=False)", "least recently freed"),
    "slot_mapping": ("03", "block_table[p // block_size] * block_size + p % block_size",
                     "block_table[p // block_size] + p % block_size", "slot"),
    "block_hash": ("04", "hashlib.sha256(parent or b\"root\")", "hashlib.sha256(b\"root\")", "parent"),
    "prefix_cache": ("04", "            if block is None:\n                break",
                     "            if block is None:\n                continue", "first miss"),
    "copy_on_write": ("04", "                self.allocator.free(block)\n", "", "block"),
}


def readme_hidden_checks() -> str:
    """The hidden-check file README.md's instructor section shows, exactly as printed there."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(# my_hidden_checks\.py.*?)```", text, re.S)
    assert block, "README.md's instructor section lost its hidden-check example"
    return block.group(1)


EXTRA = readme_hidden_checks()

STUB = 'raise NotImplementedError("YOUR CODE HERE")'
HONEST_ROPE = '''def apply_rope(x, cos, sin):
    """Rotate pairs (x1, x2) of the two halves of the last dimension by the given angles."""
    def halves(t):                       # a helper of my own
        return torch.chunk(t, 2, dim=-1)

    x1, x2 = halves(x.float())
    rotated = torch.cat((x2.neg(), x1), dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)
'''

# student -> (lesson, how the submission is changed, words the attacked exercise's message must hold)
CHEATS = {
    "cheat_import": ("00", lambda nb: exercise_cell(nb, "c19", "from minillm.models.llama import apply_rope"),
                     ["not written in the notebook", "minillm.models.llama"]),
    "cheat_subclass": ("03", lambda nb: exercise_cell(
        nb, "c09", "from minillm.kv import block_allocator as reference\nNoFreeBlocksError = reference.NoFreeBlocksError\n\n\n"
                   "class BlockAllocator(reference.BlockAllocator):\n    pass\n"),
                       ["not written in the notebook", "inherited from minillm.kv.block_allocator.BlockAllocator"]),
    "cheat_tag": ("00", lambda nb: tag(nb, "check-rope", "raises-exception"), ["check cell modified", "raises-exception"]),
    "cheat_monkeypatch": ("00", lambda nb: append(nb, "c19", "import minillm.checks\n"
                                                 "minillm.checks.check_rope = lambda f: print('✅ check_rope passed')"),
                          ["tampering", "minillm.checks.check_rope"]),
    "cheat_custom_exc": ("00", lambda nb: append(nb, "c19", "get_ipython().set_custom_exc((Exception,), "
                                                 "lambda shell, etype, value, tb, tb_offset=None: None)"),
                         ["tampering", "set_custom_exc"]),
    "cheat_transformer": ("00", lambda nb: append(nb, "c19", "get_ipython().input_transformers_post.append(\n"
                                                  "    lambda lines: [l.replace('check_rope(', 'print(') for l in lines])"),
                          ["tampering", "input_transformers_post"]),
}


def notebook(lesson: str, stubs: bool):
    """The lesson (stubs) or its reference solution, keeping only what grading needs: badge,
    setup cell, imports, exercises and their check cells."""
    name = LESSONS[lesson]
    solution = read(REPO / "solutions" / name)
    stubbed = make_lesson(solution, f"solutions/{name}")
    first_code = next(i for i, c in enumerate(stubbed.cells) if i >= 2 and c.cell_type == "code")
    keep = [i for i, c in enumerate(stubbed.cells) if i < 2 or i == first_code or exercise_of(c)
            or 'raise NotImplementedError("YOUR CODE HERE")' in c.source or c.get("id") in CHECKS_NEED.get(lesson, ())]
    nb = stubbed if stubs else make_lesson(solution, f"solutions/{name}", stubs=False)
    nb.cells = [nb.cells[i] for i in keep]
    return nb


def replace(nb, old: str, new: str):
    cell = next(c for c in nb.cells if old in c.source)
    cell.source = cell.source.replace(old, new, 1)
    return nb


def exercise_cell(nb, cell_id: str, source: str):
    next(c for c in nb.cells if c.get("id") == cell_id).source = source
    return nb


def append(nb, cell_id: str, source: str):
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    cell.source += "\n" + source
    return nb


def tag(nb, cell_id: str, name: str):
    next(c for c in nb.cells if c.get("id") == cell_id).metadata["tags"].append(name)
    return nb


def write(nb, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def grade(folder: Path, out: Path, *options: str):
    cmd = [sys.executable, "-m", "minillm.course", "grade", str(folder), "--root", str(REPO),
           "--json", str(out / "grades.json"), "--csv", str(out / "grades.csv"), *options]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    records = json.loads((out / "grades.json").read_text())
    return run.stdout, {(r["student"], r["lesson"], r["exercise"]): r for r in records}


OUT = []


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    for lesson, name in LESSONS.items():
        write(notebook(lesson, stubs=False), folder / "reference" / name)
        write(notebook(lesson, stubs=True), folder / "stubs" / name)
    by_lesson = {}
    for exercise, (lesson, old, new, _) in WRONG.items():
        student = f"wrong_{len(by_lesson.setdefault(lesson, [])) + 1}"
        by_lesson[lesson].append(exercise)
        write(replace(notebook(lesson, stubs=False), old, new), folder / student / LESSONS[lesson])
    deleted = notebook("03", stubs=False)
    deleted.cells = [c for c in deleted.cells if c.get("id") != "check-slot_mapping"]
    write(deleted, folder / "tamper" / LESSONS["03"])
    edited = notebook("00", stubs=False)
    write(replace(edited, "check_rope(apply_rope)", "print('skipped')"), folder / "tamper" / LESSONS["00"])
    for student, (lesson, cheat, _) in CHEATS.items():         # each on the stubs: nothing honest to pass
        write(cheat(notebook(lesson, stubs=True)), folder / student / LESSONS[lesson])
    write(exercise_cell(notebook("00", stubs=True), "c19", HONEST_ROPE), folder / "honest" / LESSONS["00"])
    out = tmp_path_factory.mktemp("out")
    OUT[:] = [out]
    (out / "hidden_checks.py").write_text(EXTRA)
    return grade(folder, out, "--timeout", "240", "--jobs", "2", "--extra-checks", str(out / "hidden_checks.py"))


def test_reference_passes_everything(graded):
    stdout, records = graded
    mine = {k: r for k, r in records.items() if k[0] == "reference"}
    assert len(mine) == 8 and all(r["passed"] for r in mine.values()), mine   # 6 exercises + 2 hidden checks
    assert re.search(r"^reference +1/1 +2/2 \+ 2/2 hidden +3/3$", stdout, re.M), stdout


def test_stubs_fail_everything_with_not_implemented(graded):
    _, records = graded
    mine = {k: r for k, r in records.items() if k[0] == "stubs"}
    assert len(mine) == 8 and not any(r["passed"] for r in mine.values())
    for (_, _, exercise), r in mine.items():
        if "extra" not in exercise:
            assert "not implemented yet" in r["message"], r
            assert "Traceback" not in r["message"] and "contextlib" not in r["message"]


@pytest.mark.parametrize("exercise", list(WRONG))
def test_one_wrong_implementation_fails_exactly_its_exercise(graded, exercise):
    _, records = graded
    lesson, _, _, hint = WRONG[exercise]
    student = f"wrong_{[e for e in WRONG if WRONG[e][0] == lesson].index(exercise) + 1}"
    mine = {k[2]: r for k, r in records.items() if k[:2] == (student, lesson) and "extra" not in k[2]}
    failed = [e for e, r in mine.items() if not r["passed"]]
    assert failed == [exercise], mine
    assert hint in mine[exercise]["message"], mine[exercise]


def test_deleted_or_edited_check_cell_fails_that_exercise(graded):
    _, records = graded
    assert records["tamper", "03", "slot_mapping"]["message"].startswith("check cell missing")
    assert records["tamper", "03", "block_allocator"]["passed"]
    assert records["tamper", "00", "rope"]["message"].startswith("check cell modified")
    assert not records["tamper", "00", "rope"]["passed"]


@pytest.mark.parametrize("student", list(CHEATS))
def test_a_cheat_gets_nothing_for_the_attacked_exercise(graded, student):
    """1 the package's answer imported, 2 an empty subclass of the reference, 3 a raises-exception
    tag on the check cell, 4 the grader monkeypatched, 5 set_custom_exc swallowing failures,
    6 an input transformer rewriting the check call: each passes under nbval, none is graded so."""
    _, records = graded
    lesson, _, words = CHEATS[student]
    attacked = EXERCISES[lesson][0]
    r = records[student, lesson, attacked]
    assert not r["passed"], r
    for word in words:
        assert word in r["message"], r


def test_an_honest_answer_with_its_own_helpers_passes(graded):
    _, records = graded
    assert records["honest", "00", "rope"]["passed"], records["honest", "00", "rope"]


def test_csv_and_table(graded, tmp_path):
    stdout, records = graded
    assert re.search(r"^student +00 +03 +04$", stdout, re.M), stdout
    assert re.search(r"^stubs +0/1 +0/2 \+ 0/2 hidden +0/3$", stdout, re.M), stdout
    assert "  stubs 03 block_allocator: your allocator is not implemented yet" in stdout
    import csv
    rows = list(csv.DictReader(open(OUT[0] / "grades.csv", encoding="utf-8")))
    assert len(rows) == len(records) and set(rows[0]) == {"student", "lesson", "exercise", "passed", "message"}
    assert {(r["student"], r["lesson"], r["exercise"], r["passed"]) for r in rows} >= {
        ("reference", "04", "block_hash", "True"), ("wrong_2", "03", "slot_mapping", "False")}


def test_hang_import_error_and_unreadable_notebook_are_reported(tmp_path):
    folder, out = tmp_path / "flat", tmp_path / "out"
    out.mkdir()
    hang = replace(notebook("00", stubs=False), "    xf = x.float()", "    while True:\n        pass")
    write(hang, folder / "hangs__00_setup_and_tour.ipynb")
    broken = replace(notebook("04", stubs=False), "from minillm.engine.sequence import Sequence",
                     "from minillm.engine.sequence import Sequense")
    write(broken, folder / "noimport__04_prefix_sharing.ipynb")
    (folder / "garbled__03_paged_kv.ipynb").write_text("{ not json")
    stdout, records = grade(folder, out, "--timeout", "25")
    assert records["hangs", "00", "rope"]["message"].startswith("timed out"), records
    for exercise in EXERCISES["04"]:
        r = records["noimport", "04", exercise]
        assert not r["passed"] and "raised before this check" in r["message"] and "ImportError" in r["message"], r
    assert all(records["garbled", "03", e]["message"].startswith("notebook could not be read")
               for e in EXERCISES["03"])
    assert not any(r["passed"] for r in records.values())


def test_grading_run_that_fails_exits_non_zero(tmp_path):
    run = subprocess.run([sys.executable, "-m", "minillm.course", "grade", str(tmp_path / "nowhere")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no submissions folder" in run.stderr
    (tmp_path / "empty").mkdir()
    run = subprocess.run([sys.executable, "-m", "minillm.course", "grade", str(tmp_path / "empty")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no submitted notebooks" in run.stderr


def test_table_shows_passed_over_total_and_first_hint():
    records = [Record("ann", "03", "a", True, ""), Record("ann", "03", "b", False, "wrong slot\nmore"),
               Record("bob", "03", "a", False, "x"), Record("bob", "03", "b", False, "y")]
    text = table(records)
    assert re.search(r"^ann +1/2$", text, re.M) and re.search(r"^bob +0/2$", text, re.M)
    assert "ann 03 b: wrong slot" in text and "more" not in text


VERDICT_CELLS = {
    "patched_at_run_time": "import importlib\n"
                           "grading = importlib.import_module('minillm' + '.che' + 'cks')\n"
                           "setattr(grading, 'check_' + 'rope', lambda f: True)\n"
                           "from minillm.models.llama import apply_rope as _theirs\n"
                           "def apply_rope(x, cos, sin):\n    return _theirs(x, cos, sin)\n",
    "alias_in_a_def": "from minillm.models import llama\napply_rope = llama.apply_rope\n",
    "honest": HONEST_ROPE + "print('my own test:', apply_rope(torch.zeros(1, 2), torch.ones(1, 2), "
                            "torch.zeros(1, 2)))\nmodel.forward  # a variable of another cell: ignored here\n",
    "exits": "import sys\nsys.exit(0)\n" + HONEST_ROPE,
}


@pytest.mark.parametrize("case", list(VERDICT_CELLS))
def test_verdict_process_alone(case):
    """The verdict process on one exercise cell, without nbval: a grader replaced at run time (the
    static scan cannot see it) is put back, reported, and the real check still decides; an alias
    is not the student's; an honest cell passes though a line of it needs another cell's
    variable; an exit in the cell ends nothing of the grader's."""
    from minillm.course.isolate import finish_verdicts, plan, start_verdicts, student_cells
    lesson = make_lesson(read(REPO / "solutions" / LESSONS["00"]), "solutions/" + LESSONS["00"])
    the_plan = plan(lesson)
    code = [c for c in lesson.cells if c.cell_type == "code"]
    exercise_cell(lesson, "c19", VERDICT_CELLS[case])
    verdicts, why = finish_verdicts(*start_verdicts(the_plan, student_cells(the_plan, code), None), 120)
    assert why is None, why
    passed, message = verdicts["rope"]
    if case == "patched_at_run_time":
        assert not passed and "tampering" in message and "minillm.checks.check_rope" in message, message
    elif case == "alias_in_a_def":
        assert not passed and "not written in the notebook" in message, message
    else:
        assert passed, message


def test_nbval_markers_are_stripped_and_check_cell_metadata_compared():
    from minillm.course.check_cells import check_cell_differs, strip_nbval
    course = nbformat.v4.new_code_cell("from minillm.checks import check_rope\n\ncheck_rope(apply_rope)")
    course.metadata["tags"] = ["minillm-check"]
    mine = nbformat.from_dict(json.loads(json.dumps(course)))
    assert check_cell_differs(mine, course) is None
    mine.metadata["tags"] = ["minillm-check", "raises-exception"]
    assert "added raises-exception" in check_cell_differs(mine, course)
    mine.metadata["tags"] = ["minillm-check"]
    mine.source = "# NBVAL_RAISES_EXCEPTION\n" + course.source
    assert "edited" in check_cell_differs(mine, course)
    cell = nbformat.v4.new_code_cell("x = 1\n  # NBVAL_SKIP\n#NBVAL_RAISES_EXCEPTION\ny = 2  # NBVAL_SKIP kept")
    cell.metadata["tags"] = ["raises-exception", "nbval-skip", "nbval-ignore-output", "mine"]
    strip_nbval(cell)
    assert cell.metadata["tags"] == ["mine"]
    assert cell.source == "x = 1\n  #\n#\ny = 2  # NBVAL_SKIP kept"
