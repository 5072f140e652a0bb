"""The course's build tool: lessons/ are generated from solutions/, never edited by hand.

    python -m minillm.course build   # write lessons/NN_*.ipynb from solutions/NN_*.ipynb
    python -m minillm.course check   # fail if lessons/ is stale or a solution carries outputs
    python -m minillm.course strip   # clear outputs from the solution notebooks in place
    python -m minillm.course grade SUBMISSIONS [--lessons 03,04] [--timeout S] [--csv F] [--json F]
                                     [--extra-checks MODULE]   # grade a class (see grade.py)
"""
from .build import BEGIN, END, STUB, MarkerError, build, check, clear_outputs, make_lesson, strip, stub_source

__all__ = ["BEGIN", "END", "STUB", "MarkerError", "build", "check", "clear_outputs", "make_lesson",
           "strip", "stub_source"]
