"""What a submitted notebook's cells may carry, and how a check cell is compared with the course's.

nbval reads tags and marker comments (`raises-exception`, `nbval-skip`, `# NBVAL_SKIP`, ...): a
student who adds one to a cell changes how nbval judges it, so they are taken off every cell
before a submission runs; a check cell counts as the course's only if its code, tags and nbval
metadata are the course's.
"""
from __future__ import annotations

import json
import re

import nbformat

# nbval's own markers (nbval.plugin: comment_markers, metadata_tags): a student who adds one to a
# cell changes how nbval judges it (`raises-exception` makes a failing check cell pass, `nbval-skip`
# skips it), so they are taken off every cell before a submission runs.
NBVAL_COMMENTS = ("NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP",
                  "PYTEST_VALIDATE_IGNORE_OUTPUT")
NBVAL_TAGS = frozenset({"raises-exception"} | {c.lower().replace("_", "-") for c in NBVAL_COMMENTS})
NBVAL_COMMENT = re.compile(r"^(\s*)#+\s*(?:" + "|".join(NBVAL_COMMENTS) + r")\s*$", re.M)


def strip_nbval(cell) -> None:
    """Remove nbval's tags and marker comments from `cell`, in place (a marker line becomes `#`,
    so line numbers stay)."""
    tags = cell.metadata.get("tags")
    if isinstance(tags, list):
        cell.metadata["tags"] = [t for t in tags if t not in NBVAL_TAGS]
    if cell.cell_type == "code":
        cell.source = NBVAL_COMMENT.sub(lambda m: m.group(1) + "#", cell.source)


def check_cell_differs(mine, course) -> str | None:
    """How a student's check cell differs from the course's (its source, its tags or nbval
    markers), or None when it is the course's."""
    if mine.source.strip() != course.source.strip():
        return "its code was edited"
    tags = mine.metadata.get("tags", [])
    tags = tags if isinstance(tags, list) else [repr(tags)]
    theirs = set(course.metadata.get("tags", []))
    if set(tags) != theirs:
        added, removed = sorted(set(tags) - theirs), sorted(theirs - set(tags))
        return "its tags were changed (" + "; ".join(
            ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else [])) + ")"
    extra = sorted(k for k in mine.metadata if "nbval" in k.lower() and k not in course.metadata)
    if extra:
        return f"its metadata gained {', '.join(extra)}"
    return None


def prepare(nb):
    """The submission as it runs under nbval: outputs cleared, nbval's markers stripped from
    every cell."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        strip_nbval(cell)
    return nb
