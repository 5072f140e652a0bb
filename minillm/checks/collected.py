"""A learner's exception as plain data and back, for the graders split in a collect half and a
judge half (`minillm/course/collect.py`): the collect half, in the grading sandbox, returns the
error it caught as data (`error`); the judge half raises it again (`rebuilt`) inside its
`Grader.case`, so the message reads as if the grader had caught it itself."""
from __future__ import annotations

import builtins
import threading


def error(e: BaseException, depth: int = 4) -> dict:
    """An exception as data: its type's name, its message, its cause (or context), a few deep."""
    cause = e.__cause__ or e.__context__
    return {"raised": type(e).__name__[:80], "message": str(e)[:4000],
            "cause": error(cause, depth - 1) if cause is not None and depth > 1 else None}


def is_error(data) -> bool:
    """Whether `data` is what `error` made."""
    return isinstance(data, dict) and isinstance(data.get("raised"), str)


_KNOWN = {name: kind for name, kind in vars(builtins).items() if isinstance(kind, type) and issubclass(kind, Exception)}
_KNOWN["BrokenBarrierError"] = threading.BrokenBarrierError
_made: dict[tuple[str, type], type] = {}


def rebuilt(data: dict) -> Exception:
    """The exception `error` described: a class of the same name (a subclass of the built-in one
    of that name, so `except NotImplementedError` still catches it) whose str is the message,
    with its cause chained."""
    name = str(data.get("raised", "Exception"))[:80]
    base = _KNOWN.get(name, Exception)
    if not name.isidentifier():
        name = "Exception"
    if (name, base) not in _made:
        _made[name, base] = type(name, (base,), {"__str__": lambda self: self.message,
                                                "__init__": lambda self, message: setattr(self, "message", message),
                                                "__module__": "builtins"})
    e = _made[name, base](str(data.get("message", "")))
    if is_error(data.get("cause")):
        e.__cause__ = rebuilt(data["cause"])
    return e
