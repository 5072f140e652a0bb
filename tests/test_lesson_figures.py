"""No lesson's prose states a measured figure: every timing, rate, speed ratio and measured share
is printed by the notebook from its own run (machines differ 3-10x; a figure typed into markdown
is some other machine's).

`measured_figures(markdown)` finds what looks like a measurement: a number followed by a rate
(GB/s, tok/s, tokens per second, GFLOP/s), a time (ms, µs, s, seconds, minutes), a percentage,
or a speed ratio (`2.3×`, `1.5x`, "3 times faster"). What it leaves alone:
  - code (`block_size = 16`, fenced blocks), math (`$...$`), links;
  - byte sizes (`45 KiB per token`, `a 135M model`): arithmetic on the model's shape, the same
    on every machine;
  - a multiplication or a modulo written out (`2 × parameters`, `9 % 4 = 1`): a space before
    `×`, a number after `%`.
A fact that still trips it (a definition, a bound derived in the text) goes in `ALLOWED` under
its lesson, as a phrase of the sentence: one entry per fact, each one not a measurement.
The test is one per lesson, so a lesson's failure names that lesson alone.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))

NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*(?:\s?[–-]\s?\d+(?:[.,]\d+)*)?"
UNIT = r"""(?:
      (?:[GMKT]i?B|[GMKT]FLOP)/s | GB\ per\ second | TFLOPS | GFLOPS
    | tok(?:en)?s?/s | tokens\ (?:per|a)\ second
    | (?:ms|µs|us|ns|s|sec|seconds?|milliseconds?|microseconds?|minutes?|min)(?![\w/])
    | (?:%|\ ?per\ ?cent)(?!\s*\d)
    | times\ (?:faster|slower|as\ fast|as\ slow|more|fewer|less|longer|shorter|as\ many|as\ much)
)"""
MEASURED = re.compile(rf"{NUMBER}\s?{UNIT}|{NUMBER}[×x](?![\w])", re.X)

# lesson number -> phrases of sentences whose figures are facts, not measurements
ALLOWED: dict[str, tuple[str, ...]] = {
}


def prose(markdown: str) -> str:
    """`markdown` without code, math, link targets and addresses."""
    for pattern in (r"```.*?```", r"`[^`\n]*`", r"\$\$.*?\$\$", r"\$[^$\n]*\$", r"\]\([^)]*\)",
                    r"https?://\S+", r"<[^>\n]*>"):
        markdown = re.sub(pattern, " ", markdown, flags=re.S)
    return markdown


def measured_figures(markdown: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """Each figure of `markdown` that looks measured, with some text around it."""
    text = prose(markdown)
    found = []
    for m in MEASURED.finditer(text):
        start = text.rfind("\n\n", 0, m.start()) + 2 if "\n\n" in text[:m.start()] else 0
        end = text.find("\n\n", m.end()) if "\n\n" in text[m.end():] else len(text)
        if any(phrase in " ".join(text[start:end].split()) for phrase in allowed):
            continue                                  # a fact of its paragraph, listed in ALLOWED
        found.append(" ".join(text[max(start, m.start() - 60):min(end, m.end() + 30)].split()))
    return found


# ---------------------------------------------------------------- the detector itself

SAMPLE_MEASURED = """\
At 32 GB/s the floor is 3.4 ms per token; our step reached 14 % of it.
The paged engine ran 2.3× faster than the naive loop, at 120 tok/s (about 1.5x the static batch);
a prefill took 0.8 s, and the whole run 2 minutes, 3 times faster than before, at 97.5% GPU use.
"""
SAMPLE_FACTS = """\
Blocks of `block_size = 16` slots; a float16 number is 2 bytes, and a 135M model has 30 layers.
Position 9 of D is in logical block 9 // 4 = 2, at offset 9 % 4 = 1. FLOPs are about 2 × parameters
per token. A token costs 45 KiB in float32, a 2048-token reservation 256 MiB. See lesson 05,
step 3, and $t \\ge \\frac{bytes}{B}$. The cell below prints the bandwidth in GB/s and the time in ms.
```
print(f"{t:.1f} ms at 32 GB/s")
```
[a link](https://example.com/2x-faster-10ms)
"""


def test_detector_finds_every_kind_of_measured_figure():
    found = measured_figures(SAMPLE_MEASURED)
    for figure in ("32 GB/s", "3.4 ms", "14 %", "2.3×", "120 tok/s", "1.5x", "0.8 s", "2 minutes",
                   "3 times faster", "97.5%"):
        assert any(figure in f for f in found), f"{figure!r} not found in {found}"
    assert len(found) == 10, found


def test_detector_leaves_definitions_code_math_and_sizes_alone():
    assert measured_figures(SAMPLE_FACTS) == []


def test_allowed_phrase_excuses_only_its_own_paragraph():
    text = "Quantizing to int8 errs by at most 0.39 % of the row's largest weight.\n\nIt ran 3.1× faster."
    assert len(measured_figures(text)) == 2
    assert measured_figures(text, ("at most 0.39 %",)) == ["It ran 3.1× faster."]


# ---------------------------------------------------------------- the lessons

@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_lesson_markdown_states_no_measured_figure(path):
    nb = nbformat.read(str(path), as_version=4)
    allowed = ALLOWED.get(path.name[:2], ())
    problems = [f"  cell {cell.get('id', i)}: ...{figure}..."
                for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
                for figure in measured_figures(cell.source, allowed)]
    assert not problems, (
        f"{path.relative_to(REPO)} states measured figures in its markdown; print each from the run "
        "instead (the text may say 'the cell below prints ...'), or, for a fact that is not a "
        f"measurement, add its phrase to ALLOWED['{path.name[:2]}'] in {Path(__file__).name}:\n"
        + "\n".join(problems))
