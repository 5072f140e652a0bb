"""The grading harness every lesson's graders share. `Grader` counts one check's cases,
turns a crash in the learner's code into a hint and prints the verdict; `expect` is an
`assert` that still checks under `python -O`; `fmt`, `expect_tensor` and
`expect_unchanged` phrase the complaints several graders make; `tiny_model` loads the
tiny random Llama once per session; `greedy_tie` applies the course's rule that greedy
outputs may part at a float-rounding tie. It imports no lesson module, so the lesson
modules can be imported in any order.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch


class Grader:
    """Counts the cases of one check, turns a crash in your code into a hint, prints the verdict."""

    def __init__(self, name: str, what: str):
        self.name, self.what, self.cases = name, what, 0

    @contextmanager
    def case(self, doing: str):
        """One case: any error other than a failed check is reported as your code crashing."""
        self.cases += 1
        try:
            yield
        except AssertionError:
            raise
        except NotImplementedError as e:
            raise AssertionError(f"{self.what} is not implemented yet (it raised NotImplementedError): "
                                 "fill in the exercise cell and run it again") from e
        except Exception as e:
            raise AssertionError(f"{self.what} raised {type(e).__name__}: {e}\n"
                                 f"    while {doing}") from e

    def passed(self) -> bool:
        print(f"✅ {self.name} passed ({self.cases} cases)")
        return True


def expect(ok, message: str) -> None:
    """Like `assert`, but still checks under `python -O`."""
    if not ok:
        raise AssertionError(message)


def fmt(values, digits: int = 2) -> str:
    """A short readable list: [0.6, 0.3, -inf]."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    return "[" + ", ".join(f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in values) + "]"


def expect_tensor(out, shape, what: str, integer: bool = False) -> None:
    expect(isinstance(out, torch.Tensor), f"{what} should return a torch.Tensor, got {type(out).__name__}")
    expect(tuple(out.shape) == tuple(shape),
           f"{what} returned shape {list(out.shape)}, expected {list(shape)}")
    if integer:
        expect(not out.dtype.is_floating_point and out.dtype != torch.bool,
               f"{what} should return integer token ids (torch.long), got dtype {out.dtype}")


def expect_unchanged(before: torch.Tensor, after: torch.Tensor, what: str) -> None:
    expect(torch.equal(before, after),
           f"{what} modified its input in place; return a new tensor instead "
           "(e.g. `masked_fill`, not `masked_fill_`; `x / t`, not `x /= t`)")


@functools.lru_cache(maxsize=None)
def tiny_model():
    """The tiny random Llama and the course tokenizer, loaded once per session."""
    from ..models import load_model
    return load_model("tiny-llama", device="cpu")


def greedy_tie(model, prompt_ids: list[int], ours: list[int], reference: list[int]) -> bool:
    """True when the first differing greedy token is a float-rounding tie: both tokens'
    logits lie within 1e-3 of the largest one (the course's rule: "Correctness contract",
    in the README's Tests section)."""
    from ..naive import next_token_logits_naive
    i = next((j for j, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
    if i is None:
        return False
    logits = next_token_logits_naive(model, prompt_ids + reference[:i])
    top = logits.max()
    return max(float(top - logits[ours[i]]), float(top - logits[reference[i]])) <= 1e-3
