"""Run a student's exercise cells again, outside their kernel: the lesson's import statements
first, then each exercise cell, statement by statement, compiled under the file name
`<notebook cell N>` (its source put in `linecache`, as IPython does, so code that reads a
function's source works). Shared by `verdict.py` and, in the sandbox, `serve.py`."""
from __future__ import annotations

import ast
import builtins
import linecache

CELL_FILE = "<notebook cell {}>"


def run_cells(job: dict, after_cell=None) -> tuple[dict, dict[str, str]]:
    """The namespace the lesson's imports and the exercise cells define, and exercise -> why its
    cell failed when it ran again. `after_cell(cell)` runs after each cell that compiled
    (`verdict.py` checks there that the cell replaced none of the package's objects)."""
    ns = {"__name__": "__main__", "__builtins__": builtins}
    for source in job["prelude"]:
        try:
            exec(compile(source, "<lesson imports>", "exec"), ns)
        except BaseException:
            pass
    failed = {}
    for cell in job["cells"]:
        filename = CELL_FILE.format(cell["index"])
        linecache.cache[filename] = (len(cell["source"]), None, cell["source"].splitlines(True), filename)
        try:
            tree = ast.parse(cell["source"], filename)
        except SyntaxError as e:
            for exercise in cell["exercises"]:
                failed.setdefault(exercise, f"your exercise cell has a syntax error: {e.msg} (line {e.lineno})")
            continue
        for stmt in tree.body:
            defines = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
                                        ast.ImportFrom, ast.Assign, ast.AnnAssign))
            try:
                exec(compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec"), ns)
            except BaseException as e:                    # SystemExit and KeyboardInterrupt included
                if defines:
                    for exercise in cell["exercises"]:
                        failed.setdefault(exercise, f"your exercise cell raised when it ran again for grading, "
                                                    f"at line {stmt.lineno}: {type(e).__name__}: {e}")
        if after_cell is not None:
            after_cell(cell)
    return ns, failed
