"""The students the grading tests (tests/test_grade.py, tests/test_self_check.py) are made of,
built from the course itself: every lesson of lessons/, every exercise its check cells grade.

`honest(lesson)` is a student who solved every exercise: the lesson notebook from lessons/ with
each stub (`# YOUR CODE HERE` + `raise NotImplementedError`) replaced by the reference solution's
block from solutions/ (the same cell id), exactly as a student types it in. `PLANTED` holds one
plausible mistake per exercise (a text of the solution and what replaces it, and words the
exercise's hint must hold); `test_every_exercise_has_a_planted_bug` fails as soon as a lesson
gains an exercise without one.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

from minillm.course.build import BEGIN, END, STUB, exercise_of, read

REPO = Path(__file__).resolve().parents[1]
LESSON_NAME = re.compile(r"^(\d\d)_.+\.ipynb$")


def lesson_files() -> dict[str, str]:
    """lesson number -> its notebook's name in lessons/."""
    return {m[1]: p.name for p in sorted((REPO / "lessons").iterdir()) if (m := LESSON_NAME.match(p.name))}


LESSONS = lesson_files()


def lesson(number: str):
    return read(REPO / "lessons" / LESSONS[number])


def exercises(number: str) -> list[str]:
    """The exercises lesson `number` grades, in order (one per check cell)."""
    return [e for c in lesson(number).cells if (e := exercise_of(c))]


EXERCISES = {n: exercises(n) for n in LESSONS}
EXERCISES = {n: e for n, e in EXERCISES.items() if e}


def solution_blocks(source: str) -> list[list[str]]:
    """The lines between each BEGIN / END SOLUTION pair of a solution cell, in order."""
    blocks, current = [], None
    for line in source.split("\n"):
        if line.strip() == BEGIN:
            current = []
        elif line.strip() == END:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def honest(number: str):
    """Lesson `number` from lessons/, every stub filled in with the reference solution's block."""
    nb = lesson(number)
    solution = {c.get("id"): c for c in read(REPO / "solutions" / LESSONS[number]).cells}
    for cell in nb.cells:
        if cell.cell_type != "code" or STUB[1] not in cell.source:
            continue
        stale = f"lessons/{LESSONS[number]} is not built from its solution (python -m minillm.course build)"
        assert cell.id in solution, f"{stale}: no cell {cell.id} in the solution"
        blocks = solution_blocks(solution[cell.id].source)
        lines, out = cell.source.split("\n"), []
        i = 0
        while i < len(lines):
            if lines[i].strip() == STUB[0] and i + 1 < len(lines) and lines[i + 1].strip() == STUB[1]:
                assert blocks, f"{stale}: cell {cell.id} has more stubs than solution blocks"
                out += blocks.pop(0)
                i += 2
            else:
                out.append(lines[i])
                i += 1
        assert not blocks, f"{stale}: cell {cell.id} has {len(blocks)} solution block(s) without a stub"
        cell.source = "\n".join(out)
    return nb


MODEL_LOAD = re.compile(r"^model, tokenizer = load_model\(.*\)\n", re.M)
CHECKS_NEED = {"03": ["c05"]}          # lesson 03's slot_mapping check cell prints with this cell's `tables`


def trim(nb, number: str, loads_the_model: bool = False):
    """Keep only what grading needs: badge, setup cell, imports, exercises and their check cells
    (as a student who deleted the rest); the imports cell without its `load_model(...)` line
    unless `loads_the_model` or the cell goes on to use the model."""
    first_code = next(i for i, c in enumerate(nb.cells) if i >= 2 and c.cell_type == "code")
    wanted = stubbed_cells(number) | set(CHECKS_NEED.get(number, ()))
    keep = [i for i, c in enumerate(nb.cells) if i < 2 or i == first_code or exercise_of(c) or c.get("id") in wanted]
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    imports = nb.cells[first_code]
    nb.cells = [nb.cells[i] for i in keep]
    without = MODEL_LOAD.sub("", imports.source)
    if not loads_the_model and not re.search(r"\b(model|tokenizer)\b", without):   # 09-12 use it there
        imports.source = without
    return nb


def stubbed_cells(number: str) -> set[str]:
    """Ids of the lesson's exercise cells (those holding a stub)."""
    return {c.id for c in lesson(number).cells if c.cell_type == "code" and STUB[1] in c.source}


# exercise -> (lesson, text of the reference solution, a plausible mistake in its place, words the
# exercise's message (its hint) must hold). Every exercise of the course has one: a new exercise
# fails test_every_exercise_has_a_planted_bug until it is given one here.
PLANTED = {
    "rope": ("00", "torch.cat([-x2, x1], dim=-1)", "torch.cat([x2, -x1], dim=-1)", "rotates the wrong way"),
    "top_k": ("01", "logits.masked_fill(logits < kth", "logits.masked_fill(logits <= kth", "Keep every logit >="),
    "top_p": ("01", "mass_before = probs.cumsum(dim=-1) - probs", "mass_before = probs.cumsum(dim=-1)",
              "the best token always survives"),
    "sampler": ("01", "row = logits[i] / p.temperature", "row = logits[i] * p.temperature",
                "divide the logits by the temperature"),
    "generate_naive": ("01", "model.compute_logits(hidden[-1:])", "model.compute_logits(hidden[:1])",
                       "differs from the reference at token 0"),
    "contiguous_cache": ("02", "num_keys = int(self.positions.max()) + 1", "num_keys = int(self.positions.max())",
                         "must attend to its own row's keys at positions 0..p"),
    "block_allocator": ("03", "            self.free_blocks[block] = None",
                        "            self.free_blocks[block] = None\n"
                        "            self.free_blocks.move_to_end(block, last=False)", "least recently freed"),
    "slot_mapping": ("03", "block_table[p // block_size] * block_size + p % block_size",
                     "block_table[p // block_size] + p % block_size", "slot"),
    "paged_attention": ("03", "n = int(step.seq_lens[b])", "n = int(step.seq_lens[b]) - 1", "one key short"),
    "block_hash": ("04", "hashlib.sha256(parent or b\"root\")", "hashlib.sha256(b\"root\")", "parent"),
    "prefix_cache": ("04", "            if block is None:\n                break",
                     "            if block is None:\n                continue", "first miss"),
    "copy_on_write": ("04", "                self.allocator.free(block)\n", "", "block"),
    "scheduler": ("05", "len(self.running) < self.max_num_seqs", "len(self.running) <= self.max_num_seqs",
                  "more than max_num_seqs"),
    "preemption": ("06", "return max(self.running, key=self.rank)", "return min(self.running, key=self.rank)",
                   "the lowest ranked one"),
    "swap": ("06", "            self.cpu_allocator.free(cpu_block)\n", "", "should be free again"),
    "detokenizer": ("07", "if not delta or delta.endswith(REPLACEMENT_CHAR):", "if not delta:", "broken UTF-8"),
    "request_stream": ("07", "            self.front.send((\"abort\", list(self.unfinished)))\n", "",
                       "sent no abort"),
    "paged_decode_kernel": ("08", "        s = tl.where(ok[None, :], s, float(\"-inf\"))\n", "",
                            "must not count (mask the loads"),
    "int8_quantizer": ("09", "q = torch.round(w / scale[:, None])", "q = torch.trunc(w / scale[:, None])",
                       "rounding by truncation"),
    "int4_quantizer": ("09", "(minimum.float()[..., None] + groups * scale.float()[..., None])",
                       "(groups * scale.float()[..., None])", "forgets the minimum"),
    "layer_sharding": ("10", "mlp.down_proj = RowParallelLinear(row_shard(mlp.down_proj, rank * width, width), group)",
                       "mlp.down_proj = row_shard(mlp.down_proj, rank * width, width)", "did no all-reduce"),
    "router_choice": ("10", "in_flight[best] - in_flight[least] > load_bound",
                      "in_flight[best] - in_flight[least] >= load_bound", "exactly at the bound still wins"),
    "balanced_partition": ("10", "    ranges, end = [], n\n", "    ranges, end = [], n - 1\n", "is in no stage"),
    "ngram_proposer": ("11", "for start in range(length - n - 1, -1, -1):", "for start in range(length - n - 1):",
                       "the latest one wins"),
    "rejection_sampler": ("11", "return drafts[:accepted] + [best[accepted]]", "return drafts[:accepted]",
                          "the bonus"),
    "structured_outputs": ("12", "    rows[which] = sub\n", "", "left row 0 unmasked"),
    "choice_constraint": ("12", "out = {self.eos_token_id} if END in node else set()", "out = set()",
                          "EOS (token 2) must be allowed"),
}


def planted(exercise: str):
    """The honest student of the exercise's lesson with the exercise's planted mistake."""
    number, old, new, _ = PLANTED[exercise]
    nb = honest(number)
    cells = [c for c in nb.cells if c.get("id") in stubbed_cells(number) and old in c.source]
    assert len(cells) == 1 and cells[0].source.count(old) == 1, \
        f"{exercise}: the planted mistake's text is not once in one exercise cell of lesson {number}: {old!r}"
    cells[0].source = cells[0].source.replace(old, new)
    return nb

