"""Grading untrusted notebooks in the sandbox (issue 31): `python -m minillm.course grade` with the
default sandbox (bubblewrap: skipped, with the reason, where it cannot run) over a class of
lessons 10-12 with honest students and students who attack the grading, then the honest ones
again with `--sandbox none` (the loud warning).

The attacks, each on lesson 11's exercises (graded from outside the sandbox, their answers
withheld inside it) unless said: the package's answer called from a thread, served by a child
`python` over a pipe, by a forked `multiprocessing` pool (lesson 10's router), the package's
source exec'd under a notebook label, its code relabelled (`co_filename`), `gc` on the graders,
a forged verdict line then `os._exit`, a write into the installed package, a read of the hidden
checks (the test hands it their path), a write into another student's notebook, a double-forked
`setsid` daemon that rewrites the grade files, a memory hog; and lesson 12's choice constraint
(graded outside too) wrapping the package's class, built and called in another thread; lesson 03's
block allocator and slot mapping (engine-driven, judged outside with the student's objects across
the sandbox) attacked by thread, exec under a notebook label, subprocess, `gc`, `co_filename`
relabelling, a write into the installed package and a forged verdict line; lessons 01, 02 and 04's
block hash (judged outside too) attacked by thread, exec under a notebook label, a forged verdict
line and a child Python (tests/test_grade.py grades
every lesson's honest and planted students in the sandbox: lessons 04-06's classes, which get the
engine's sequences and block manager across it, included). Each attacked exercise gets 0, the
honest students (graded after the attackers) pass, no hidden-check text is in any output, no
process of the class is left, and the grade files are unchanged after grading ends.

Submissions keep only the cells grading needs (badge, setup, imports, exercises, checks), as
tests/test_grade.py does; the class is graded once per module.
"""
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from minillm.course.build import exercise_of
from minillm.course.isolate import plan

sys.path.insert(0, str(Path(__file__).parent))
from grading_class import EXERCISES, LESSONS, honest, lean, lesson, trim  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
MARK = "H8-SECRET-HIDDEN-7f3a"                      # in the hidden checks' source only
DAEMON = "H8-DAEMON-91c2"                           # in the daemon's command line
GRADED = ("10", "11", "12")


def _bwrap_problem():
    from minillm.course import sandbox
    return sandbox.probe()


def trimmed(nb, number: str):
    """The notebook with only the badge, the setup cell, the imports, the exercise cells and the checks."""
    exercise_cells = set(plan(lesson(number)).cells)
    code = [i for i, c in enumerate(nb.cells) if i >= 2 and c.cell_type == "code"]
    keep = [i for i, c in enumerate(nb.cells) if i < 2 or i == code[0] or exercise_of(c)
            or c.get("id") in exercise_cells]
    nb.cells = [nb.cells[i] for i in keep]
    return nb


def student(number: str, stubs: bool = False, **cells: str):
    """Lesson `number` solved (or its stubs), trimmed, with exercise cells replaced by id."""
    base = lesson(number) if stubs else honest(number)
    nb = trim(base, number) if number == "03" else trimmed(base, number)   # 03's checks need a cell more
    for cell_id, source in cells.items():
        cell = next(c for c in nb.cells if c.get("id") == cell_id.replace("_", "-"))
        cell.source = source
    return nb


def stub_of(number: str, cell_id: str) -> str:
    return next(c.source for c in lesson(number).cells if c.get("id") == cell_id)


def solved(number: str, cell_id: str) -> str:
    return next(c.source for c in honest(number).cells if c.get("id") == cell_id)


NGRAM, VERIFY, ROUTER = "t11_05", "t11_10", "t10_18"

THREAD = '''from concurrent.futures import ThreadPoolExecutor
from minillm.spec import ngram as _pkg


def propose_ngram(tokens, k, min_n, max_n):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_pkg.propose_ngram, tokens, k, min_n, max_n).result()
'''
EXEC = '''import minillm.spec.rejection as _r
_space = {"__name__": "mine"}
_text = open(_r.__file__).read().replace("from ..sample", "from minillm.sample")
exec(compile(_text, "<note" + "book cell 9>", "exec"), _space)
verify = _space["verify"]
'''
SUBPROCESS = '''import json, subprocess, sys
_SERVER = ("import sys, json\\nfrom minillm.spec.ngram import propose_ngram as p\\n"
           "for line in sys.stdin:\\n    print(json.dumps(p(*json.loads(line))), flush=True)\\n")
_child = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def propose_ngram(tokens, k, min_n, max_n):
    _child.stdin.write(json.dumps([tokens, k, min_n, max_n]) + "\\n")
    _child.stdin.flush()
    return json.loads(_child.stdout.readline())
'''
GC = '''import types
_gc = __import__("g" + "c")
for _o in _gc.get_objects():
    if isinstance(_o, types.FunctionType) and _o.__name__.startswith("check_"):
        try:
            setattr(_o, "__co" + "de__", getattr(lambda *a, **k: True, "__co" + "de__"))
        except (ValueError, TypeError):
            pass


def verify(logits, drafts, params, generator=None):
    raise NotImplementedError("YOUR CODE HERE")
'''
RELABEL = '''from minillm.spec import ngram as _n
_f = _n.propose_ngram
propose_ngram = type(_f)(getattr(_f, "__co" + "de__").replace(co_filename="<note" + "book cell 3>"),
                         getattr(_f, "__glo" + "bals__"), "propose_ngram")
'''
PACKAGE_WRITE = '''import importlib
_target = importlib.import_module("minillm.ch" + "ecks.lesson11_rejection").__file__
try:
    with open(_target, "a") as _f:
        _f.write("\\n# written by a student\\n")
except OSError as _e:
    print("could not write:", _e)


def verify(logits, drafts, params, generator=None):
    raise NotImplementedError("YOUR CODE HERE")
'''
FORGE = '''import json, os, sys
from minillm.spec.ngram import propose_ngram as _theirs


def propose_ngram(tokens, k, min_n, max_n):
    return _theirs(tokens, k, min_n, max_n)


if "IPython" not in getattr(sys, "mod" + "ules"):      # only where the verdict is decided
    _fake = json.dumps([{"exercise": e, "passed": True, "message": ""} for e in ("ngram_proposer", "rejection_sampler")])
    _nonces = [open(n).read() for n in os.listdir(".") if n.endswith(".json")] if os.path.isdir(".") else []
    for _fd in range(0, 64):
        for _nonce in ["0" * 32] + _nonces:
            try:
                os.write(_fd, (_nonce[:32] + _fake + "\\n").encode())
            except OSError:
                pass
    os._exit(0)
'''


def read_hidden(path: Path) -> str:
    return f'''import glob, os


def _look():
    found = ""
    for p in [{str(path)!r}] + glob.glob("/proc/*/cmdline"):
        try:
            found += open(p, errors="replace").read()
        except OSError:
            pass
    return found


print("found:", _look())


def propose_ngram(tokens, k, min_n, max_n):
    raise ValueError("leaked: " + _look())
'''


def write_other(path: Path) -> str:
    return f'''try:
    with open({str(path)!r}, "w") as _f:
        _f.write("{{}}")
except OSError as _e:
    print("could not write:", _e)


def verify(logits, drafts, params, generator=None):
    raise NotImplementedError("YOUR CODE HERE")
'''


def daemon(grades: Path) -> str:
    loop = (f"import time\\nfor _ in range(600):\\n    time.sleep(0.2)\\n    try:\\n        open({str(grades)!r}, 'w').write('[]')\\n"
            f"    except OSError:\\n        pass  # {DAEMON}\\n")
    return f'''import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        subprocess.Popen([sys.executable, "-c", {loop!r}], start_new_session=True)
    os._exit(0)


def propose_ngram(tokens, k, min_n, max_n):
    raise NotImplementedError("YOUR CODE HERE")
'''


HOG = '''_hog = []
for _ in range(16):
    _hog.append(bytearray(512 << 20))


def verify(logits, drafts, params, generator=None):
    raise NotImplementedError("YOUR CODE HERE")
'''
POOL = '''import multiprocessing
from minillm.server.data_parallel import choice as _c
_pool = multiprocessing.get_context("fork").Pool(1)


def choose_replica(match_lengths, in_flight, load_bound=4):
    return _pool.apply(_c.choose_replica, (match_lengths, in_flight, load_bound))
'''

THREAD_CLASS = '''from concurrent.futures import ThreadPoolExecutor
from minillm.structured import choice_trie as _ct


def _elsewhere(fn, *args):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


class MyChoiceConstraint:
    def __init__(self, choices, tokenizer):
        self._inner = _elsewhere(_ct.ChoiceConstraint, choices, tokenizer)

    def allowed(self, generated):
        return _elsewhere(self._inner.allowed, generated)

    def is_complete(self, generated):
        return _elsewhere(self._inner.is_complete, generated)
'''


# lesson 03: engine-driven exercises, judged outside with the student's objects across the sandbox
ALLOCATOR = "c09"
THREAD_SLOTS = THREAD.replace("from minillm.spec import ngram as _pkg", "from minillm.attention import paged as _pkg") \
    .replace("propose_ngram, tokens, k, min_n, max_n", "slot_mapping, block_table, positions, block_size") \
    .replace("propose_ngram(tokens, k, min_n, max_n)", "slot_mapping(block_table, positions, block_size)")
EXEC_ALLOCATOR = '''import minillm.kv.block_allocator as _b
_space = {"__name__": "mine"}
exec(compile(open(_b.__file__).read(), "<note" + "book cell 9>", "exec"), _space)
BlockAllocator, NoFreeBlocksError = _space["BlockAllocator"], _space["NoFreeBlocksError"]
'''
SUBPROCESS_SLOTS = SUBPROCESS.replace("from minillm.spec.ngram import propose_ngram as p",
                                      "from minillm.attention.paged import slot_mapping as p") \
    .replace("def propose_ngram(tokens, k, min_n, max_n):", "def slot_mapping(block_table, positions, block_size):") \
    .replace("[tokens, k, min_n, max_n]", "[list(block_table), list(positions), block_size]")
RELABEL_SLOTS = '''from minillm.attention import paged as _p
_f = _p.slot_mapping
slot_mapping = type(_f)(getattr(_f, "__co" + "de__").replace(co_filename="<note" + "book cell 3>"),
                        getattr(_f, "__glo" + "bals__"), "slot_mapping")
'''
FORGE_SLOTS = FORGE.replace("from minillm.spec.ngram import propose_ngram as _theirs",
                            "from minillm.attention.paged import slot_mapping as _theirs") \
    .replace("def propose_ngram(tokens, k, min_n, max_n):\n    return _theirs(tokens, k, min_n, max_n)",
             "def slot_mapping(block_table, positions, block_size):\n    return _theirs(block_table, positions, block_size)") \
    .replace('("ngram_proposer", "rejection_sampler")', '("block_allocator", "slot_mapping", "paged_attention")')


def with_stub_class(prefix: str, number: str, cell_id: str) -> str:
    return prefix + "\n\n" + stub_of(number, cell_id)


def hidden_checks(path: Path) -> None:
    path.write_text(f'''# hidden checks for lesson 11: {MARK}
def lesson11_repeat_proposes(ns):
    """{MARK}"""
    got = ns["propose_ngram"]([1, 2, 1], 2, 1, 1)
    assert list(got) == [2, 1], f"[1, 2, 1] with k=2, n=1 gave {{got}}"
''')


# student -> (lesson, the exercises attacked)
ATTACKERS = {"a_thread_exec": ("11", ["ngram_proposer", "rejection_sampler"]),
             "a_subprocess_gc": ("11", ["ngram_proposer", "rejection_sampler"]),
             "a_relabel_pkgwrite": ("11", ["ngram_proposer", "rejection_sampler"]),
             "a_forge": ("11", ["ngram_proposer", "rejection_sampler"]),
             "a_hidden_other": ("11", ["ngram_proposer", "rejection_sampler"]),
             "a_daemon_hog": ("11", ["ngram_proposer", "rejection_sampler"]),
             "a_pool": ("10", ["router_choice"]),
             "a_thread_12": ("12", ["choice_constraint"])}
ATTACKERS03 = {"a3_thread_exec": ["block_allocator", "slot_mapping"],
               "a3_subprocess_gc": ["block_allocator", "slot_mapping"],
               "a3_relabel_pkgwrite": ["block_allocator", "slot_mapping"],
               "a3_forge": ["slot_mapping"]}


def write(nb, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def processes_with(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


def grade(folder: Path, out: Path, *options: str, env=None):
    cmd = [sys.executable, "-m", "minillm.course", "grade", str(folder), "--root", str(REPO),
           "--json", str(out / "grades.json"), "--csv", str(out / "grades.csv"), "--jobs", "2", *options]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=out, env=env)
    print(run.stdout, run.stderr, f"\ngrading took {time.perf_counter() - t0:.0f} s")
    assert run.returncode == 0, run.stdout + run.stderr
    records = json.loads((out / "grades.json").read_text())
    return run, {(r["student"], r["lesson"], r["exercise"]): r for r in records}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    problem = _bwrap_problem()
    if problem:
        pytest.skip(f"no sandbox on this machine: {problem}")
    folder, out = tmp_path_factory.mktemp("class"), tmp_path_factory.mktemp("out")
    hidden = out / "hidden_checks.py"
    hidden_checks(hidden)
    victim = folder / "zz_victim" / LESSONS["11"]
    package_file = REPO / "minillm" / "checks" / "lesson11_rejection.py"
    before = hashlib.sha256(package_file.read_bytes()).hexdigest()
    write(student("11", t11_05=THREAD, t11_10=EXEC), folder / "a_thread_exec" / LESSONS["11"])
    write(student("11", t11_05=SUBPROCESS, t11_10=GC), folder / "a_subprocess_gc" / LESSONS["11"])
    write(student("11", t11_05=RELABEL, t11_10=PACKAGE_WRITE), folder / "a_relabel_pkgwrite" / LESSONS["11"])
    write(student("11", t11_05=FORGE), folder / "a_forge" / LESSONS["11"])
    write(student("11", t11_05=read_hidden(hidden), t11_10=write_other(victim)), folder / "a_hidden_other" / LESSONS["11"])
    write(student("11", t11_05=daemon(out / "grades.json"), t11_10=HOG), folder / "a_daemon_hog" / LESSONS["11"])
    write(student("10", t10_18=POOL), folder / "a_pool" / LESSONS["10"])
    write(student("12", t12_18=THREAD_CLASS), folder / "a_thread_12" / LESSONS["12"])
    for number in GRADED:
        write(student(number), folder / "honest" / LESSONS[number])
    write(student("11"), victim)
    write(student("11", stubs=True), folder / "zz_stub" / LESSONS["11"])
    victim_bytes = victim.read_bytes()
    env = dict(os.environ, MINILLM_GRADE_MEMORY=str(3 << 30))
    run, records = grade(folder, out, "--lessons", ",".join(GRADED), "--extra-checks", str(hidden), "--timeout", "300",
                         env=env)
    files = {name: (out / name).read_bytes() for name in ("grades.json", "grades.csv")}
    time.sleep(3)                                            # a daemon would have written by now
    return {"run": run, "records": records, "out": out, "files": files, "victim": (victim, victim_bytes),
            "package": [(package_file, before)]}


@pytest.fixture(scope="module")
def attacked03(tmp_path_factory):
    """Lesson 03 (engine-driven, judged outside): four attackers and an honest student, graded once."""
    problem = _bwrap_problem()
    if problem:
        pytest.skip(f"no sandbox on this machine: {problem}")
    folder, out = tmp_path_factory.mktemp("class03"), tmp_path_factory.mktemp("out03")
    write(student("03", True, c09=EXEC_ALLOCATOR, c12=THREAD_SLOTS), folder / "a3_thread_exec" / LESSONS["03"])
    write(student("03", True, c09=with_stub_class(GC.split("\n\n\ndef ")[0], "03", ALLOCATOR), c12=SUBPROCESS_SLOTS),
          folder / "a3_subprocess_gc" / LESSONS["03"])
    write(student("03", True, c09=with_stub_class(PACKAGE_WRITE.split("\n\n\ndef ")[0].replace(
        "lesson11_rejection", "lesson03"), "03", ALLOCATOR), c12=RELABEL_SLOTS),
        folder / "a3_relabel_pkgwrite" / LESSONS["03"])
    write(student("03", True, c12=FORGE_SLOTS), folder / "a3_forge" / LESSONS["03"])
    write(student("03"), folder / "honest" / LESSONS["03"])
    package_file = REPO / "minillm" / "checks" / "lesson03.py"
    before = hashlib.sha256(package_file.read_bytes()).hexdigest()
    run, records = grade(folder, out, "--lessons", "03", "--timeout", "300")
    return {"records": records, "package": (package_file, before)}


# lessons 01, 02 and 04's block hash, judged outside too: 01's sampler and naive generation with
# references standing in across the sandbox, 02's cache class with the judge's model calling it,
# 04's block hash with its fresh-process run in a sandbox of its own
THREAD_SAMPLE = '''from concurrent.futures import ThreadPoolExecutor
from minillm.sample import sampler as _pkg


def sample(logits, params, generators):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_pkg.sample, logits, params, generators).result()
'''
EXEC_NAIVE = '''import minillm.baselines.naive_generation as _n
_space = {"__name__": "mine"}
exec(compile(open(_n.__file__).read().replace("from ..", "from minillm."), "<note" + "book cell 9>", "exec"), _space)
generate_naive = _space["generate_naive"]
'''
FORGE_CACHE = '''import json, os, sys
from minillm.kv import contiguous as _c
ContiguousKVCache = _c.ContiguousKVCache

if "IPython" not in getattr(sys, "mod" + "ules"):      # only where the verdict is decided
    _fake = json.dumps([{"exercise": "contiguous_cache", "passed": True, "message": ""}])
    for _fd in range(0, 64):
        try:
            os.write(_fd, ("0" * 32 + _fake + "\\n").encode())
        except OSError:
            pass
    os._exit(0)
'''
SUBPROCESS_HASH = '''import subprocess, sys
_SERVER = ("import sys\\nfrom minillm.kv.prefix_cache import block_hash as h\\n"
           "for line in sys.stdin:\\n    p, t = eval(line)\\n    print(h(p, t).hex(), flush=True)\\n")
_child = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def block_hash(parent, token_ids):
    _child.stdin.write(repr((parent, list(token_ids))) + "\\n")
    _child.stdin.flush()
    return bytes.fromhex(_child.stdout.readline().strip())
'''
# student -> (lesson, {cell id: attack}, the exercises attacked)
ATTACKERS_EARLY = {"e1_thread_exec": ("01", {"c14": THREAD_SAMPLE, "c17": EXEC_NAIVE}, ["sampler", "generate_naive"]),
                   "e2_forge": ("02", {"c11": FORGE_CACHE}, ["contiguous_cache"]),
                   "e4_subprocess": ("04", {"c13": SUBPROCESS_HASH}, ["block_hash"])}


@pytest.fixture(scope="module")
def attacked_early(tmp_path_factory):
    """Lessons 01, 02 and 04: an attack on each exercise moved outside, the lesson's other
    exercises left honest (lean notebooks), graded once."""
    problem = _bwrap_problem()
    if problem:
        pytest.skip(f"no sandbox on this machine: {problem}")
    folder, out = tmp_path_factory.mktemp("class_early"), tmp_path_factory.mktemp("out_early")
    for name, (number, cells, _) in ATTACKERS_EARLY.items():
        nb = trim(honest(number), number)
        for cell in nb.cells:
            cell.source = cells.get(cell.get("id"), cell.source)
        write(lean(nb), folder / name / LESSONS[number])
    run, records = grade(folder, out, "--lessons", "01,02,04", "--timeout", "300")
    return records


def test_lessons_01_02_04_attacked_get_nothing_the_rest_passes(attacked_early):
    """The sampler's answer called from a thread, the naive loop exec'd from the package's source
    under a notebook label, a forged verdict line from 02's cache cell, the block hash served by a
    child Python: each gets 0 (the answers are withheld in the sandbox, no verdict is decided
    there); 01's top-k and top-p and 04's prefix cache and copy-on-write, honest, pass."""
    records = attacked_early
    for name, (number, _, attacked) in ATTACKERS_EARLY.items():
        mine = {k[2]: r for k, r in records.items() if k[:2] == (name, number)}
        assert set(mine) == set(EXERCISES[number]), mine
        for exercise, r in mine.items():
            assert r["passed"] is (exercise not in attacked), r
    assert "withheld while grading" in records["e1_thread_exec", "01", "sampler"]["message"]


def test_every_exercise_is_judged_outside_the_sandbox():
    """No exercise is left to a verdict process that shares a process with student code: every
    grader of the course is judged outside (`judge.OUTSIDE`), so each one's answer is withheld inside."""
    from minillm.course.judge import OUTSIDE
    graders = {f"check_{e}" for exercises in EXERCISES.values() for e in exercises}
    assert graders and graders <= OUTSIDE, sorted(graders - OUTSIDE)


def test_engine_driven_lesson_attacked_gets_nothing_honest_passes(attacked03):
    """Lesson 03's allocator and slot mapping, which the grader plugs into the engine outside the
    sandbox: every attack scores 0, the package is untouched, the honest student passes all three."""
    records = attacked03["records"]
    for name, exercises in ATTACKERS03.items():
        for exercise in exercises:
            assert not records[name, "03", exercise]["passed"], records[name, "03", exercise]
    honest03 = {k[2]: r for k, r in records.items() if k[0] == "honest"}
    assert set(honest03) == set(EXERCISES["03"]) and all(r["passed"] for r in honest03.values()), honest03
    path, before = attacked03["package"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_every_attacked_exercise_gets_nothing(attacked):
    records = attacked["records"]
    for name, (number, exercises) in ATTACKERS.items():
        for exercise in exercises:
            r = records[name, number, exercise]
            assert not r["passed"], r


def test_honest_students_pass_and_are_untouched(attacked):
    """The honest students (graded after the attackers; the victim's notebook was a target) pass
    every exercise and the hidden check; lesson 12's classes (graded inside a sandbox) too."""
    records = attacked["records"]
    for name in ("honest", "zz_victim"):
        mine = {k: r for k, r in records.items() if k[0] == name}
        assert mine and all(r["passed"] for r in mine.values()), mine
    assert len([k for k in records if k[0] == "honest"]) == sum(len(EXERCISES[n]) for n in GRADED) + 1   # + hidden
    for name, (number, exercises) in ATTACKERS.items():                 # what was not attacked still passes
        if number != "11":
            others = [r for k, r in records.items() if k[:2] == (name, number) and k[2] not in exercises]
            assert others and all(r["passed"] for r in others), others
    victim, content = attacked["victim"]
    assert victim.read_bytes() == content
    stub = {k[2]: r for k, r in records.items() if k[0] == "zz_stub"}
    assert not any(r["passed"] for r in stub.values()), stub


def test_the_package_is_unchanged(attacked):
    for path, before in attacked["package"]:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before, path


def test_no_hidden_check_text_in_any_output(attacked):
    run, out = attacked["run"], attacked["out"]
    for text in (run.stdout, run.stderr, (out / "grades.json").read_text(), (out / "grades.csv").read_text()):
        assert MARK not in text and "lesson11_repeat_proposes" not in text
    r = attacked["records"]["a_hidden_other", "11", "repeat_proposes (extra)"]
    assert not r["passed"] and "leaked" in r["message"], r


def test_nothing_left_running_and_grade_files_stay(attacked):
    assert processes_with(DAEMON) == []
    for name, content in attacked["files"].items():
        assert (attacked["out"] / name).read_bytes() == content, name


def _memory_cgroup() -> bool:
    from minillm.course.limits import Cgroup
    group = Cgroup(1 << 30, 64)
    usable = any("memory" in str(p) for p in group.paths)
    group.close()
    return usable


def test_sandbox_failures_are_reported(attacked):
    """With a memory cgroup (this machine lets the grader make one) the hog's sandbox is killed
    whole and reported under the table; without one, the address-space rlimit fails its allocation."""
    run, records = attacked["run"], attacked["records"]
    hog = records["a_daemon_hog", "11", "rejection_sampler"]["message"]
    assert "timed out" not in hog, hog                      # the sandbox ended when its memory ran out
    if _memory_cgroup():
        assert "sandbox failures:" in run.stdout and "a_daemon_hog 11: memory" in run.stdout, run.stdout
    else:
        assert "MemoryError" in hog, hog
    assert all(r["sandbox"] == "bwrap" and r["warning"] == "" for r in records.values())


def test_answers_are_withheld_in_the_copy():
    from minillm.course.withheld import package_without
    root = package_without(frozenset({"check_ngram_proposer"}))
    text = (root / "spec" / "ngram.py").read_text()
    assert "withheld while grading" in text
    assert (root / "spec" / "rejection.py").read_text() == (REPO / "minillm" / "spec" / "rejection.py").read_text()
    compile(text, "ngram.py", "exec")
    root = package_without(frozenset({"check_scheduler"}))          # a subclass exercise: its methods only
    text = (root / "engine" / "scheduler.py").read_text()
    assert text.count("withheld while grading") == 4 and "class ContinuousBatchingScheduler" in text
    assert "minillm.engine.scheduler.ContinuousBatchingScheduler.schedule: withheld" in text   # names what was called
    assert "withheld" not in (root / "kv" / "block_manager.py").read_text()


def test_a_function_whose_code_the_grader_reads_is_read_from_the_cells_source():
    """Lesson 13's chain_root grader reads the function's code (no salted hash()): outside the
    sandbox that code is compiled from the exercise cells the judge holds, calls still go across."""
    from minillm.checks.lesson04_prefix_cache import _uses_builtin_hash
    from minillm.course.code_read import read_here
    from minillm.course.wire import decode, encode

    def cells(source):
        return [{"index": 7, "source": source, "exercises": ["chain_root"]}]
    honest = read_here(lambda seq: b"root", "chain_root", cells(
        "import hashlib\ndef chain_root(seq):\n    return hashlib.sha256(b'x').digest()\n"))
    assert honest(None) == b"root" and not _uses_builtin_hash(honest)
    assert honest.__code__.co_filename == "<notebook cell 7>"
    assert _uses_builtin_hash(read_here(None, "chain_root", cells("def chain_root(seq):\n    return hash(seq)\n")))
    assert _uses_builtin_hash(read_here(None, "chain_root", cells(           # bound by assignment: the cell's code
        "def make():\n    return lambda seq: hash(seq)\nchain_root = make()\n")))
    assert not _uses_builtin_hash(read_here(None, "chain_root", cells(       # the cell's own hash
        "from hashlib import sha256 as hash\ndef chain_root(seq):\n    return hash(seq)\n")))
    blobs = []                                                               # lesson 10's stages cross as ranges
    assert decode(encode([range(0, 3), range(3, 7)], blobs), blobs) == [range(0, 3), range(3, 7)]


def test_honest_students_pass_without_a_sandbox_with_the_warning(tmp_path):
    folder, out = tmp_path / "class", tmp_path / "out"
    out.mkdir()
    for number in GRADED:
        write(student(number), folder / "honest" / LESSONS[number])
    run, records = grade(folder, out, "--lessons", ",".join(GRADED), "--sandbox", "none")
    assert len(records) == sum(len(EXERCISES[n]) for n in GRADED) and all(r["passed"] for r in records.values()), \
        records
    assert run.stdout.startswith("WARNING: graded with --sandbox none")
    assert all(r["sandbox"] == "none" and r["warning"].startswith("WARNING") for r in records.values())


def test_references_stand_in_across_the_channel_and_are_revoked_after():
    """Lesson 01's naive generation is graded with the judge's sampler standing in for the
    notebook's (its answer is withheld in the sandbox): the sandbox puts a handle to it in the
    function's globals, then the notebook's own back; a handle kept past the check is refused.
    The sampler's top-k and top-p stand in from the sandbox's own package. A generator shared by
    rows crosses as one object; the course's tiny model by name."""
    import threading

    import torch

    from minillm.checks.harness import tiny_model
    from minillm.course import serve, wire
    from minillm.course.outside_help import standing_in
    from minillm.course.proxy import Peer
    from minillm.sample import sampler
    to_side, from_judge = os.pipe()
    to_judge, from_side = os.pipe()
    judge = Peer(os.fdopen(to_judge, "rb"), os.fdopen(from_judge, "wb"))
    ns = {"__name__": "__main__"}
    exec("import torch\nkept = []\ndef apply_top_k(x, k):\n    return 'mine'\ndef sample(*a):\n    return 'mine'\n"
         "def loop(*a):\n    kept.append(sample)\n    return sample(*a), apply_top_k(torch.tensor([1.0, 2.0]), 1)\n"
         "def again(*a):\n    return kept[0](*a)\n", ns)
    side = Peer(os.fdopen(to_side, "rb"), os.fdopen(from_side, "wb"),
                extra=lambda request: serve.answer(request, ns, {}, side))

    def serve_side():
        while (request := wire.receive(side.inp))[0].get("op") != "bye":
            side.serve(*request)
    thread = threading.Thread(target=serve_side, daemon=True)
    thread.start()
    loop = judge.ask({"op": "get", "name": "loop"})
    g = torch.Generator().manual_seed(3)
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    with standing_in(judge, "check_generate_naive", "loop", frozenset({"check_sampler", "check_generate_naive"})):
        token, top_k = loop(logits, [sampler.SamplingParams(temperature=0)], [g])
    assert token.tolist() == [1] and top_k.tolist() == [float("-inf"), 2.0]   # the judge's sample, the package's top-k
    assert loop(None) == ("mine", "mine")                                      # the notebook's own again
    with pytest.raises(LookupError, match="no longer reachable"):
        judge.ask({"op": "get", "name": "again"})(logits, [sampler.SamplingParams(temperature=0)], [None])
    blobs = []
    rows = wire.decode(wire.encode([g, g, torch.Generator()], blobs), blobs)
    assert rows[0] is rows[1] and rows[2] is not rows[0] and len(blobs) == 2
    model = tiny_model()[0]
    assert wire.decode(wire.encode(model, blobs), blobs) is model
    wire.send(judge.out, {"op": "bye"}, [])
    thread.join(10)


def test_an_exception_handed_back_across_the_channel_is_the_same_object():
    """Lesson 12's grader plants an exception in a matcher and checks that the student's
    mask_logits hands that very exception to on_error (or lets it out): across the sandbox, an
    exception the judge raised comes back as itself."""
    import threading

    from minillm.course import wire
    from minillm.course.proxy import Peer
    to_side, from_judge = os.pipe()
    to_judge, from_side = os.pipe()
    judge = Peer(os.fdopen(to_judge, "rb"), os.fdopen(from_judge, "wb"))

    def catch(fail, report):
        try:
            fail()
        except ValueError as e:
            report(e)
    ns = {"catch": catch, "leak": lambda fail: fail(), "boom": lambda: int("its own")}
    side = Peer(os.fdopen(to_side, "rb"), os.fdopen(from_side, "wb"), extra=lambda request: ns[request["name"]])

    def serve():
        while (request := wire.receive(side.inp))[0].get("op") != "bye":
            side.serve(*request)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    planted, got = ValueError("planted"), []

    def fail():
        raise planted
    judge.ask({"op": "get", "name": "catch"})(fail, got.append)
    assert len(got) == 1 and got[0] is planted
    with pytest.raises(ValueError) as raised:
        judge.ask({"op": "get", "name": "leak"})(fail)
    assert raised.value is planted
    with pytest.raises(ValueError, match="its own") as raised:               # the side's own: a copy
        judge.ask({"op": "get", "name": "boom"})()
    assert type(raised.value) is ValueError
    wire.send(judge.out, {"op": "bye"}, [])
    thread.join(10)
