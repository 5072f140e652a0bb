"""What the grader tests (tests/test_checks_*.py) share: a planted mistake must be rejected."""
import pytest


def rejects(check, bad, match=None):
    with pytest.raises(AssertionError, match=match):
        check(bad)
