"""`python -m minillm.course self-check`'s own cases (fast: no notebook runs; tests/test_grade.py
self-checks notebooks of its graded class against grade's verdicts)."""
import os
import subprocess
import sys


def self_check(*args, **env):
    return subprocess.run([sys.executable, "-m", "minillm.course", "self-check", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_self_check_says_what_it_cannot_check(tmp_path):
    run = self_check(tmp_path / "03_paged_kv.ipynb")
    assert run.returncode == 2 and "no notebook" in run.stderr, run.stderr
    (tmp_path / "mine.ipynb").write_text("{}")
    run = self_check(tmp_path / "mine.ipynb")
    assert run.returncode == 2 and "--lesson 03" in run.stderr, run.stderr
    run = self_check(tmp_path / "mine.ipynb", "--lesson", "42")
    assert run.returncode == 2 and "no lesson 42" in run.stderr, run.stderr


def test_self_check_inside_a_notebook_being_graded_does_nothing(tmp_path):
    """A self-check cell left in a notebook would run the notebook again when it is graded (and
    again inside that run): under grading it only says it is skipped."""
    (tmp_path / "03_paged_kv.ipynb").write_text("{}")
    run = self_check(tmp_path / "03_paged_kv.ipynb", MINILLM_GRADE_RECORD=str(tmp_path / "record.jsonl"))
    assert run.returncode == 0 and "skipped" in run.stdout, run.stdout + run.stderr
