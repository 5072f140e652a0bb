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

EXTRA = '''
def lesson03_allocator_hands_out_every_block(ns):
    allocator = ns["BlockAllocator"](3)
    got = sorted(allocator.allocate() for _ in range(3))
    assert got == [0, 1, 2], f"allocating 3 blocks of 3 gave {got}"
'''


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
    out = tmp_path_factory.mktemp("out")
    OUT[:] = [out]
    (out / "hidden_checks.py").write_text(EXTRA)
    return grade(folder, out, "--timeout", "240", "--jobs", "2", "--extra-checks", str(out / "hidden_checks.py"))


def test_reference_passes_everything(graded):
    stdout, records = graded
    mine = {k: r for k, r in records.items() if k[0] == "reference"}
    assert len(mine) == 7 and all(r["passed"] for r in mine.values()), mine   # 6 exercises + 1 hidden check
    assert re.search(r"^reference +1/1 +3/3 +3/3$", stdout, re.M), stdout


def test_stubs_fail_everything_with_not_implemented(graded):
    _, records = graded
    mine = {k: r for k, r in records.items() if k[0] == "stubs"}
    assert len(mine) == 7 and not any(r["passed"] for r in mine.values())
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


def test_csv_and_table(graded, tmp_path):
    stdout, records = graded
    assert re.search(r"^student +00 +03 +04$", stdout, re.M) and re.search(r"^stubs +0/1 +0/3 +0/3$", stdout, re.M)
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


def test_nbval_markers_are_stripped_and_check_cell_metadata_compared():
    from minillm.course.grade import check_cell_differs, strip_nbval
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
