"""Checks at the door: a bad option fails when it is given, naming the field and what it
accepts, instead of deep inside a step where it would take the whole batch down.

Python's `bool` is an `int` (`True + 1 == 2`), so every integer check refuses bools
explicitly: `top_k=True` is a mistake, not a 1.
"""
from __future__ import annotations

import copy
import math
import numbers


def is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def refuse(field: str, message: str, error=ValueError):
    """Raise `error(message)` naming the field at fault in `.param` (the server's `param`)."""
    e = error(message)
    e.param = field
    raise e


def fail(owner: str, name: str, allowed: str, value, error=ValueError):
    refuse(name, f"{owner}.{name} must be {allowed}, got {value!r:.80}", error)


def check_int(owner: str, name: str, value, minimum: int | None = None, maximum: int | None = None,
              optional: bool = False) -> None:
    if value is None and optional:
        return
    lo = "" if minimum is None else f" >= {minimum}"
    hi = "" if maximum is None else f" <= {maximum}"
    allowed = f"an integer{lo}{' and' if lo and hi else ''}{hi}" + (" or None" if optional else "")
    if not is_int(value):
        fail(owner, name, allowed, value, TypeError)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        fail(owner, name, allowed, value)


def check_number(owner: str, name: str, value, allowed: str, ok) -> None:
    """A finite real number (not a bool) for which `ok(value)` holds."""
    if not is_number(value):
        fail(owner, name, allowed, value, TypeError)
    if not math.isfinite(value) or not ok(value):
        fail(owner, name, allowed, value)


def check_bool(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        fail(owner, name, "True or False", value, TypeError)


def check_choice(owner: str, name: str, value, choices, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or value not in choices:
        fail(owner, name, "one of " + ", ".join(repr(c) for c in choices) + (" or None" if optional else ""),
             value, ValueError if isinstance(value, str) else TypeError)


class Validated:
    """Base for option dataclasses: `validate()` runs on construction and again on every
    later assignment (on a trial copy, so a refused value never lands). Why: an option
    changed after construction would otherwise skip the checks and fail mid-step."""

    def validate(self) -> None:              # subclasses check (and normalise) their fields
        raise NotImplementedError

    def __post_init__(self):
        self.validate()
        object.__setattr__(self, "_validated", True)

    def __setattr__(self, name, value):
        if self.__dict__.get("_validated"):
            trial = copy.copy(self)
            object.__setattr__(trial, name, value)
            trial.validate()
            value = trial.__dict__[name]     # as normalised by validate()
        object.__setattr__(self, name, value)
