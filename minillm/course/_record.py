"""A pytest plugin for `python -m minillm.course grade`: writes one JSON line per notebook
cell (nbval item) to $MINILLM_GRADE_RECORD as soon as it starts and when it ends, so that
the grade command still knows what ran, and which cell was running, when it has to kill a
notebook that runs past its timeout."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

# Loaded before nbval (run_notebook.py's `-p` order): nbval imports nbformat, whose validator imports
# jsonschema, which imports rfc3987_syntax where it is installed and builds its IRI grammar then
# (~0.8 s of every graded notebook's run). No notebook schema has a format to check: go without it.
sys.modules.setdefault("rfc3987_syntax", None)

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failed|Interrupt|Exit|Iteration))\b:?\s?(.*)$")


def _write(record: dict) -> None:
    path = os.environ.get("MINILLM_GRADE_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


def cell_error(traceback: str) -> tuple[str, str]:
    """(exception name, message) from a kernel traceback as nbval keeps it (ANSI colours
    included): the last line naming an exception, and the lines after it."""
    lines = [ANSI.sub("", line).rstrip() for line in (traceback or "").split("\n")]
    for i in range(len(lines) - 1, -1, -1):
        found = EXCEPTION_LINE.match(lines[i])
        if found:
            rest = [line for line in lines[i + 1:] if line.strip()]
            if found.group(1) == "CheckFailed":            # its last line is advice for the learner
                rest = [line for line in rest if not line.startswith("(check_")]
            return found.group(1), "\n".join([found.group(2)] + rest).strip()
    text = "\n".join(line for line in lines if line.strip())
    return "Error", text[-500:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cell = getattr(item, "cell_num", None)
    if cell is None or (report.when == "setup" and report.passed) or report.when == "teardown":
        return
    if report.skipped:                                   # nbval xfails the cells after a timeout
        _write({"event": "end", "cell": cell, "passed": False, "error": "NotRun",
                "message": "not run: an earlier cell ran past the timeout"})
        return
    if report.passed:
        _write({"event": "end", "cell": cell, "passed": True})
        return
    exc = call.excinfo.value if call.excinfo else None
    text = str(exc) if exc is not None else str(report.longrepr)
    if "Timeout of" in text:
        error, message = "Timeout", text
    else:
        error, message = cell_error(getattr(exc, "inner_traceback", None) or str(report.longrepr))
    _write({"event": "end", "cell": cell, "passed": False, "error": error, "message": message})


def pytest_runtest_logstart(nodeid, location):
    found = re.search(r"::Cell (\d+)$", nodeid)
    if found:
        _write({"event": "start", "cell": int(found.group(1))})
