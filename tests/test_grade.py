"""`python -m minillm.course grade` over a class generated from the course (tests/grading_class.py):
an honest student of every lesson, 00 to 12 (the reference solutions typed into the stubs of
lessons/: every exercise passes, so no lesson is unpassable and no rule against cheating fires
on an honest answer), one with the stubs of 00, 03 and 04 (all fail), one planted mistake per
exercise of the course (exactly that exercise fails, with its hint; mistakes of one lesson that
no check can see together share a notebook), a deleted and an edited check cell, hidden checks
(--extra-checks), cheats (each attack gets 0 for the attacked exercise, with a message naming
it: the six attacks of issue 19 on lesson 00, and again over lessons 01, 03, 04, 05, 06 and 08, several attacks per notebook where a lesson has several exercises, plus
exercises that merely call the package's answer), and, in the flat `student__NN_name.ipynb`
layout beside those folders, a notebook whose imports fail and one that is not a notebook; in a
second run with a short timeout, a notebook that hangs. `python -m minillm.course self-check` on notebooks of the class
gives grade's verdicts (exit 0 for the honest one, 1 with the hint for a planted mistake).

To keep the run short, submissions keep only the cells grading needs (the badge, the setup
cell, the imports, the exercises and their checks), as a student who deleted the rest
would; the full lessons run in the notebook tests. Only the reference student keeps its whole
imports cell, model load included; every other student's keeps only what its cells use
(grading_class.lean), and a planted-bug student keeps only the check cells that can reach its
bug (grading_class.planted_submission: the others would cost seconds and prove nothing about
that bug), and mistakes whose checks are apart (lesson 09's two quantizers) share a notebook
(grading_class.planted_students: each kept check still sees one mistake at most). The three
hooks of issue 19 that the static scan reports as tampering share one notebook (each must be
named in its message). The class is graded once per test
session, also under xdist (the first worker grades, the others read its result).
"""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grading_class import (EXERCISES, LESSONS, PLANTED, REPO, checks_seeing, honest, lean, planted_student,
                           planted_students, planted_submission, trim)
from grading_class import lesson as lesson_notebook
from minillm.course.build import make_lesson, read, strip_markers
from minillm.course.grade import Record, table

# the first test grades the class (its fixture): more than the suite's 900 s default on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STUBBED = ("00", "03", "04")            # the lessons the stubs student submits


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



def monkeypatch(check: str) -> str:
    return f"import minillm.checks\nminillm.checks.{check} = lambda f: print('✅ {check} passed')"


CUSTOM_EXC = "get_ipython().set_custom_exc((Exception,), lambda shell, etype, value, tb, tb_offset=None: None)"


def transformer(check: str) -> str:
    return (f"get_ipython().input_transformers_post.append(\n"
            f"    lambda lines: [l.replace('{check}(', 'print(') for l in lines])")


# student -> (lesson, the attacks: (what they do to the submission, the attacked exercise, words its
# message must hold)). Each submission starts from the stubs: nothing honest in it can pass. The
# six attacks: 1 the package's answer imported, 2 an empty subclass (or an alias) of the reference,
# 3 a raises-exception tag on the check cell, 4 the grader monkeypatched, 5 set_custom_exc
# swallowing failures, 6 an input transformer rewriting the check call; and 7, an exercise that
# merely calls the package's answer (by module, through super(), or in a Triton kernel). 4, 5 and 6
# on lesson 00 share one notebook: its exercise's message must name each of them.
CHEATS = {
    "cheat_import": ("00", [(lambda nb: exercise_cell(nb, "c19", "from minillm.models.llama import apply_rope"),
                             "rope", ["not written in the notebook", "minillm.models.llama"])]),
    "cheat_subclass": ("03", [(lambda nb: exercise_cell(
        nb, "c09", "from minillm.kv import block_allocator as reference\nNoFreeBlocksError = reference.NoFreeBlocksError\n\n\n"
                   "class BlockAllocator(reference.BlockAllocator):\n    pass\n"),
        "block_allocator", ["not written in the notebook", "inherited from minillm.kv.block_allocator.BlockAllocator"])]),
    "cheat_tag": ("00", [(lambda nb: tag(nb, "check-rope", "raises-exception"), "rope",
                          ["check cell modified", "raises-exception"])]),
    "cheat_hooks": ("00", [(lambda nb: append(nb, "c19", monkeypatch("check_rope")), "rope",
                            ["tampering", "minillm.checks.check_rope"]),
                           (lambda nb: append(nb, "c19", CUSTOM_EXC), "rope", ["tampering", "set_custom_exc"]),
                           (lambda nb: append(nb, "c19", transformer("check_rope")), "rope",
                            ["tampering", "input_transformers_post"])]),
    "cheat_01": ("01", [
        (lambda nb: exercise_cell(nb, "c09", "from minillm.sample.sampler import apply_top_k"), "top_k",
         ["not written in the notebook", "minillm.sample.sampler"]),
        (lambda nb: append(nb, "c11", CUSTOM_EXC), "top_p", ["tampering", "set_custom_exc"]),
        (lambda nb: exercise_cell(nb, "c14", "from minillm.sample import sampler as theirs\n\n\n"
                                             "def sample(logits, params, generators):\n"
                                             "    return theirs.sample(logits, params, generators)\n"),
         "sampler", ["calls the package's answer", "minillm.sample.sampler.sample"]),
        (lambda nb: append(nb, "c17", transformer("check_generate_naive")), "generate_naive",
         ["tampering", "input_transformers_post"])]),
    "cheat_04": ("04", [
        (lambda nb: exercise_cell(nb, "c13", "from minillm.kv.prefix_cache import block_hash"), "block_hash",
         ["not written in the notebook", "minillm.kv.prefix_cache"]),
        (lambda nb: append(nb, "c16", monkeypatch("check_prefix_cache")), "prefix_cache",
         ["tampering", "minillm.checks.check_prefix_cache"]),
        (lambda nb: exercise_cell(nb, "c19", "class CowBlockManager(BlockManager):\n"
                                             "    def append_slots(self, seq, num_new_tokens: int = 1) -> None:\n"
                                             "        return super().append_slots(seq, num_new_tokens)\n"),
         "copy_on_write", ["calls the package's answer", "minillm.kv.block_manager.BlockManager.append_slots"])]),
    "cheat_05_import": ("05", [(lambda nb: exercise_cell(
        nb, "46f3b156", "from minillm.engine.scheduler import ContinuousBatchingScheduler as ContinuousScheduler"),
        "scheduler", ["not written in the notebook", "inherited from minillm.engine.scheduler.ContinuousBatchingScheduler"])]),
    "cheat_05_super": ("05", [(lambda nb: exercise_cell(
        nb, "46f3b156", "class ContinuousScheduler(ContinuousBatchingScheduler):\n"
                        "    def schedule(self) -> SchedulerOutput:\n        return super().schedule()\n"),
        "scheduler", ["calls the package's answer", "ContinuousBatchingScheduler.schedule"])]),
    "cheat_06": ("06", [
        (lambda nb: exercise_cell(nb, "bdd9b349", "from minillm.engine.scheduler import Scheduler as PreemptingScheduler"),
         "preemption", ["not written in the notebook", "inherited from minillm.engine.scheduler.Scheduler"]),
        (lambda nb: tag(nb, "check-swap", "raises-exception"), "swap", ["check cell modified", "raises-exception"])]),
    "cheat_08": ("08", [(lambda nb: exercise_cell(
        nb, "a8c00010", "from minillm.attention.triton_decode import paged_decode_kernel as my_paged_decode_kernel"),
        "paged_decode_kernel", ["not written in the notebook", "minillm.attention.triton_decode"])]),
}
ATTACKS = [pytest.param(student, exercise, words, id=f"{student}-{exercise}-{words[-1][:24]}")
           for student, (_, attacks) in CHEATS.items() for _, exercise, words in attacks]


def notebook(number: str, stubs: bool, loads_the_model: bool = False):
    """Lesson `number` with its stubs, or its honest student, trimmed (grading_class.trim)."""
    return trim(lesson_notebook(number) if stubs else honest(number), number, loads_the_model)


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


def grade(folder: Path, out: Path, *options: str, timeout: float = 600):
    cmd = [sys.executable, "-m", "minillm.course", "grade", str(folder), "--root", str(REPO),
           "--json", str(out / "grades.json"), "--csv", str(out / "grades.csv"), *options]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out)
    print(run.stdout, run.stderr)
    (out / "grade_stdout.txt").write_text(run.stdout)       # ends with "graded N notebook(s) in T s"
    assert run.returncode == 0, run.stdout + run.stderr
    records = json.loads((out / "grades.json").read_text())
    return run.stdout, {(r["student"], r["lesson"], r["exercise"]): r for r in records}


OUT = []


def grade_once(tmp_path_factory, make):
    """`make(out)`'s result, computed once per session: under xdist the first worker computes it
    and the others wait for it and read it (the class is the slow part of this file)."""
    import os

    from filelock import FileLock
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp("out")
        return out, make(out)
    shared = tmp_path_factory.getbasetemp().parent          # this session's, shared by its workers
    saved = shared / "graded_class.json"
    with FileLock(str(saved) + ".lock"):
        if not saved.is_file():
            out = shared / "graded_class_out"
            out.mkdir()
            stdout, records = make(out)
            saved.write_text(json.dumps({"out": str(out), "stdout": stdout, "records": list(records.values())}))
        data = json.loads(saved.read_text())
    return Path(data["out"]), (data["stdout"], {(r["student"], r["lesson"], r["exercise"]): r for r in data["records"]})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out, result = grade_once(tmp_path_factory, lambda out: grade_class(tmp_path_factory, out))
    OUT[:] = [out]
    return result


def grade_class(tmp_path_factory, out: Path):
    folder = out / "class"                    # kept: the self-check tests run some of its notebooks again
    for lesson, name in LESSONS.items():
        write(notebook(lesson, stubs=False, loads_the_model=True), folder / "reference" / name)
        if lesson in STUBBED:
            write(lean(notebook(lesson, stubs=True)), folder / "stubs" / name)
    for student, exercises in planted_students().items():
        write(planted_submission(*exercises), folder / student / LESSONS[PLANTED[exercises[0]][0]])
    deleted = notebook("03", stubs=False)
    deleted.cells = [c for c in deleted.cells if c.get("id") != "check-slot_mapping"]
    write(lean(deleted), folder / "tamper" / LESSONS["03"])
    edited = notebook("00", stubs=False)
    write(lean(replace(edited, "check_rope(apply_rope)", "print('skipped')")), folder / "tamper" / LESSONS["00"])
    for student, (lesson, attacks) in CHEATS.items():         # each on the stubs: nothing honest to pass
        nb = notebook(lesson, stubs=True)
        for cheat, _, _ in attacks:
            nb = cheat(nb)
        write(lean(nb), folder / student / LESSONS[lesson])
    write(lean(exercise_cell(notebook("00", stubs=True), "c19", HONEST_ROPE)), folder / "honest" / LESSONS["00"])
    # the flat layout, mixed with the folders: a notebook whose imports fail, and one that is not a notebook
    broken = replace(notebook("04", stubs=False), "from minillm.engine.sequence import Sequence",
                     "from minillm.engine.sequence import Sequense")
    write(broken, folder / "noimport__04_prefix_sharing.ipynb")
    (folder / "garbled__03_paged_kv.ipynb").write_text("{ not json")
    (out / "hidden_checks.py").write_text(EXTRA)
    # about 53 notebooks, ~8 s of CPU each: ~4 minutes on 2 free cores; the limit leaves room for a loaded machine
    return grade(folder, out, "--timeout", "240", "--jobs", "2", "--extra-checks", str(out / "hidden_checks.py"),
                 timeout=2400)


def test_reference_passes_everything(graded):
    """The honest answers of every lesson in the class, helpers of the lesson's (lesson 01's
    make_generator and StopChecker, lesson 04's cdiv, the block manager's own methods) and
    decorators (@torch.inference_mode, @triton.jit) included: no rule against cheating fires."""
    stdout, records = graded
    mine = {k: r for k, r in records.items() if k[0] == "reference"}
    total = sum(len(e) for e in EXERCISES.values()) + 2                     # + 2 hidden checks
    assert len(mine) == total and all(r["passed"] for r in mine.values()), mine
    row = "".join(f" +{len(e)}/{len(e)}" + (r" \+ 2/2 hidden" if n == "03" else "") for n, e in EXERCISES.items())
    assert re.search(f"^reference{row}$", stdout, re.M), stdout


def test_stubs_fail_everything_with_not_implemented(graded):
    _, records = graded
    mine = {k: r for k, r in records.items() if k[0] == "stubs"}
    assert len(mine) == sum(len(EXERCISES[n]) for n in STUBBED) + 2 and not any(r["passed"] for r in mine.values())
    for (_, _, exercise), r in mine.items():
        if "extra" not in exercise:
            assert "not implemented yet" in r["message"], r
            assert "Traceback" not in r["message"] and "contextlib" not in r["message"]


@pytest.mark.parametrize("exercise", list(PLANTED))
def test_one_planted_bug_fails_exactly_its_exercise(graded, exercise):
    """Of the checks that can reach the planted code (its own, and those of exercises whose cells
    use what it defines: grading_class.checks_seeing), exactly its own fails, with its hint; the
    submission holds no other check cell (each reported missing) but those of the other mistakes
    its notebook holds (grading_class.planted_students: mistakes no check sees together), which
    their own case of this test decides."""
    _, records = graded
    lesson, _, _, hint = PLANTED[exercise]
    student, seeing = planted_student(exercise), checks_seeing(exercise)
    others = set().union(*(checks_seeing(e) for e in planted_students()[student] if e != exercise))
    assert not seeing & others, (exercise, student)
    mine = {k[2]: r for k, r in records.items() if k[:2] == (student, lesson) and "extra" not in k[2]}
    assert set(mine) == set(EXERCISES[lesson]), mine
    failed = [e for e, r in mine.items() if e in seeing and not r["passed"]]
    assert failed == [exercise], mine
    assert hint in mine[exercise]["message"], mine[exercise]
    assert all(r["message"].startswith("check cell missing") for e, r in mine.items() if e not in seeing | others), mine


def test_deleted_or_edited_check_cell_fails_that_exercise(graded):
    _, records = graded
    assert records["tamper", "03", "slot_mapping"]["message"].startswith("check cell missing")
    assert records["tamper", "03", "block_allocator"]["passed"]
    assert records["tamper", "00", "rope"]["message"].startswith("check cell modified")
    assert not records["tamper", "00", "rope"]["passed"]


@pytest.mark.parametrize("student, exercise, words", ATTACKS)
def test_a_cheat_gets_nothing_for_the_attacked_exercise(graded, student, exercise, words):
    """1 the package's answer imported, 2 an empty subclass or an alias of the reference, 3 a
    raises-exception tag on the check cell, 4 the grader monkeypatched, 5 set_custom_exc swallowing
    failures, 6 an input transformer rewriting the check call, 7 a function or method that calls the
    package's answer: each passes under nbval, none is graded so, and the message names it."""
    _, records = graded
    r = records[student, CHEATS[student][0], exercise]
    assert not r["passed"], r
    for word in words:
        assert word in r["message"], r


def test_an_honest_answer_with_its_own_helpers_passes(graded):
    _, records = graded
    assert records["honest", "00", "rope"]["passed"], records["honest", "00", "rope"]


def test_csv_and_table(graded, tmp_path):
    stdout, records = graded
    assert re.search("^student" + "".join(f" +{n}" for n in EXERCISES) + "$", stdout, re.M), stdout
    stubs = {n: f"0/{len(EXERCISES[n])}" + (r" \+ 0/2 hidden" if n == "03" else "") for n in STUBBED}
    assert re.search("^stubs" + "".join(f" +{stubs.get(n, '-')}" for n in EXERCISES) + "$", stdout, re.M), stdout
    assert "  stubs 03 block_allocator: your allocator is not implemented yet" in stdout
    import csv
    rows = list(csv.DictReader(open(OUT[0] / "grades.csv", encoding="utf-8")))
    assert len(rows) == len(records) and set(rows[0]) == {"student", "lesson", "exercise", "passed", "message"}
    assert {(r["student"], r["lesson"], r["exercise"], r["passed"]) for r in rows} >= {
        ("reference", "04", "block_hash", "True"), (planted_student("slot_mapping"), "03", "slot_mapping", "False")}


def self_check(notebook: Path, tmp_path: Path):
    out = tmp_path / "verdicts.json"
    run = subprocess.run([sys.executable, "-m", "minillm.course", "self-check", str(notebook), "--root", str(REPO),
                          "--timeout", "240", "--json", str(out)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    print(run.stdout, run.stderr)
    return run, {r["exercise"]: r for r in json.loads(out.read_text())} if out.is_file() else {}


def test_self_check_gives_the_graders_verdicts(graded, tmp_path):
    """A student's `self-check` of one notebook: grade's verdicts and hints for it (the same
    function grades it), a table, exit 0 when every exercise passes (lesson 00's honest student)
    and 1 when one fails (lesson 01's planted sampler bug: that check fails with its hint, the
    generate_naive check passes, the two check cells its submission lacks are missing)."""
    _, records = graded
    run, mine = self_check(OUT[0] / "class" / "honest" / LESSONS["00"], tmp_path)
    assert run.returncode == 0 and re.search(r"^rope +passed$", run.stdout, re.M), run.stdout
    assert "1/1 exercises pass" in run.stdout
    assert {e: r["passed"] for e, r in mine.items()} == {"rope": True}
    assert planted_students()[planted_student("sampler")] == ("sampler",)      # its notebook: that mistake alone
    run, mine = self_check(OUT[0] / "class" / planted_student("sampler") / LESSONS["01"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"^sampler +FAILED +\S", run.stdout, re.M) and PLANTED["sampler"][3] in run.stdout, run.stdout
    assert re.search(r"^generate_naive +passed$", run.stdout, re.M), run.stdout
    assert re.search(r"^top_k +FAILED +check cell missing", run.stdout, re.M), run.stdout
    assert "1/4 exercises pass" in run.stdout
    graders = {k[2]: r for k, r in records.items() if k[:2] == (planted_student("sampler"), "01")}
    assert {e: (r["passed"], r["message"]) for e, r in mine.items()} == \
        {e: (r["passed"], r["message"]) for e, r in graders.items()}


def test_import_error_and_unreadable_notebook_are_reported(graded):
    """Two notebooks of the class in the flat layout (`student__NN_name.ipynb`, beside the
    students' folders): one whose imports fail, one that is not a notebook."""
    _, records = graded
    for exercise in EXERCISES["04"]:
        r = records["noimport", "04", exercise]
        assert not r["passed"] and "raised before this check" in r["message"] and "ImportError" in r["message"], r
    assert all(records["garbled", "03", e]["message"].startswith("notebook could not be read")
               for e in EXERCISES["03"])
    assert not any(r["passed"] for k, r in records.items() if k[0] in ("noimport", "garbled"))


def test_hang_is_reported(tmp_path):
    """A notebook that never ends is killed at the limit (the run's wall time is that limit, so it
    is short: whether the kernel was still starting or in the endless cell, it timed out)."""
    folder, out = tmp_path / "flat", tmp_path / "out"
    out.mkdir()
    hang = replace(notebook("00", stubs=False), "    xf = x.float()", "    while True:\n        time.sleep(0.5)")
    write(hang, folder / "hangs__00_setup_and_tour.ipynb")
    stdout, records = grade(folder, out, "--timeout", "10")
    assert records["hangs", "00", "rope"]["message"].startswith("timed out"), records
    assert not records["hangs", "00", "rope"]["passed"]


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
               Record("bob", "03", "a", False, "x"), Record("bob", "08", "k", False,
                                                             "wrong output on: one block.\n    sequence 0, head 1\n"
                                                             "    Hint: mask the loads")]
    text = table(records)
    assert re.search(r"^ann +1/2 +-$", text, re.M) and re.search(r"^bob +0/1 +0/1$", text, re.M)
    assert "ann 03 b: wrong slot" in text and "more" not in text
    assert "bob 08 k: wrong output on: one block. | Hint: mask the loads" in text and "head 1" not in text


def kernel_calling_the_package_kernel() -> str:
    """Lesson 08's exercise cell with a kernel whose body only calls the package's kernel."""
    lesson = make_lesson(read(REPO / "solutions" / LESSONS["08"]), "solutions/" + LESSONS["08"])
    source = next(c.source for c in lesson.cells if c.get("id") == "a8c00010")
    names = [a.arg for a in ast.parse(source).body[0].args.args]
    return ("from minillm.attention.triton_decode import paged_decode_kernel\n\n\n"
            + source[:source.index('"""')] + f"paged_decode_kernel({', '.join(names)})\n")


def lesson12_class() -> str:
    """Lesson 12's exercise 1 as solved, from the class on: its mask_logits then calls whatever
    `apply_masks` the cell defines or imports (PART_ANSWERS guards the package's)."""
    source = next(c.source for c in read(REPO / "solutions" / VERDICT_LESSONS["12"]).cells if c.get("id") == "t12-09")
    return strip_markers(source[source.index("class MyStructuredOutputs"):])


VERDICT_LESSONS = {**LESSONS, "12": "12_structured_outputs.ipynb"}
VERDICT_EXERCISES = {**EXERCISES, "12": ["structured_outputs", "choice_constraint"]}

# case -> (lesson, exercise cell, its source (None: the solution's), None when it passes, else words its message holds)
VERDICT_CELLS = {
    "patched_at_run_time": ("00", "c19", "import importlib\n"
                            "grading = importlib.import_module('minillm' + '.che' + 'cks')\n"
                            "setattr(grading, 'check_' + 'rope', lambda f: True)\n"
                            "from minillm.models.llama import apply_rope as _theirs\n"
                            "def apply_rope(x, cos, sin):\n    return _theirs(x, cos, sin)\n",
                            ["tampering", "minillm.checks.check_rope"]),
    "alias_in_a_def": ("00", "c19", "from minillm.models import llama\napply_rope = llama.apply_rope\n",
                       ["not written in the notebook"]),
    "calls_the_answer_found_by_name": ("00", "c19", "from minillm.models import llama\n\n\n"
                                       "def apply_rope(x, cos, sin):\n"
                                       "    return getattr(llama, 'apply_' + 'rope')(x, cos, sin)\n",
                                       ["calls the package's answer minillm.models.llama.apply_rope"]),
    "kernel_calls_the_package_kernel": ("08", "a8c00010", kernel_calling_the_package_kernel(),
                                        ["calls the package's answer",
                                         "minillm.attention.triton_decode.paged_decode_kernel"]),
    "honest": ("00", "c19", HONEST_ROPE + "print('my own test:', apply_rope(torch.zeros(1, 2), torch.ones(1, 2), "
                                          "torch.zeros(1, 2)))\nmodel.forward  # a variable of another cell: ignored here\n",
               None),
    "exits": ("00", "c19", "import sys\nsys.exit(0)\n" + HONEST_ROPE, None),
    "calls_part_of_the_answer": ("12", "t12-09", "from minillm.structured.matchers import apply_masks\n\n\n"
                                 + lesson12_class(), ["calls the package's answer minillm.structured.matchers.apply_masks"]),
    "writes_its_own_part": ("12", "t12-09", None, None),
}


@pytest.mark.parametrize("case", list(VERDICT_CELLS))
def test_verdict_process_alone(case):
    """The verdict process on one exercise cell, without nbval: a grader replaced at run time (the
    static scan cannot see it) is put back, reported, and the real check still decides; an alias
    is not the student's; a function that calls the package's answer (found by a name built at
    run time, so only the run-time rule sees it) or a Triton kernel that does (compiled on a GPU,
    so the static rule reads it) gets nothing; an honest cell passes though a line of it needs
    another cell's variable; an exit in the cell ends nothing of the grader's; lesson 12's class
    whose mask_logits calls the package's apply_masks (a part of the answer, harness.PART_ANSWERS)
    gets nothing, while the solution, which writes its own apply_masks, passes."""
    from minillm.course.isolate import finish_verdicts, plan, start_verdicts, student_cells
    lesson_number, cell_id, source, words = VERDICT_CELLS[case]
    name = VERDICT_LESSONS[lesson_number]
    lesson = make_lesson(read(REPO / "solutions" / name), "solutions/" + name)
    the_plan = plan(lesson)
    code = [c for c in lesson.cells if c.cell_type == "code"]
    if source is None:
        source = strip_markers(next(c.source for c in read(REPO / "solutions" / name).cells if c.get("id") == cell_id))
    exercise_cell(lesson, cell_id, source)
    verdicts, why = finish_verdicts(*start_verdicts(the_plan, student_cells(the_plan, code), None), 120)
    assert why is None, why
    passed, message = verdicts[VERDICT_EXERCISES[lesson_number][0]]
    if words is None:
        assert passed, message
    else:
        assert not passed and all(w in message for w in words), message


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
