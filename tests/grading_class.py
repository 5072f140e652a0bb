"""The students the grading tests (tests/test_grade.py, tests/test_self_check.py) are made of,
built from the course itself: every lesson of lessons/, every exercise its check cells grade.

`honest(lesson)` is a student who solved every exercise: the lesson notebook from lessons/ with
each stub (`# YOUR CODE HERE` + `raise NotImplementedError`) replaced by the reference solution's
block from solutions/ (the same cell id), exactly as a student types it in. `PLANTED` holds one
plausible mistake per exercise (a text of the solution and what replaces it, and words the
exercise's hint must hold); `test_every_exercise_has_a_planted_bug` fails as soon as a lesson
gains an exercise without one.

Submissions are cut to what grading needs (each kernel start and each check costs seconds):
`trim` keeps the badge, setup cell, imports, exercises and checks; `lean` then keeps, of the
imports cell, only what the kept cells use (no model load, no `matplotlib` or `openai` import
where nothing kept needs them); `planted_submission` keeps, of the other exercises' check cells,
those whose check can reach the planted exercise's code (`checks_seeing`). Mistakes of one lesson
that no check can see together (disjoint `checks_seeing` sets) are handed in in one notebook
(`planted_students`): each kept check then sees one mistake at most, as beside that mistake
alone, and the class has fewer notebooks to run.
"""
from __future__ import annotations

import ast
import functools
import json
import re
import symtable
from pathlib import Path

import nbformat

from minillm.course.build import BEGIN, END, STUB, exercise_of, read
from minillm.course.isolate import plan
from minillm.course.tamper_scan import parse, python_source

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
    "lora_delta": ("13", "return torch.bmm(b, shrunk).squeeze(2) * s.unsqueeze(1)", "return torch.bmm(b, shrunk).squeeze(2)",
                   "without the scaling"),
    "chain_root": ("13", "return None if lora is None else hashlib.sha256(lora.cache_salt).digest()", "return None",
                   "the key is without the adapter"),
}


def planted(*exercises: str):
    """The honest student of the exercises' lesson with each exercise's planted mistake."""
    number = PLANTED[exercises[0]][0]
    nb = honest(number)
    for exercise in exercises:
        lesson_of, old, new, _ = PLANTED[exercise]
        assert lesson_of == number, f"{exercises}: planted mistakes of different lessons"
        cells = [c for c in nb.cells if c.get("id") in stubbed_cells(number) and old in c.source]
        assert len(cells) == 1 and cells[0].source.count(old) == 1, \
            f"{exercise}: the planted mistake's text is not once in one exercise cell of lesson {number}: {old!r}"
        cells[0].source = cells[0].source.replace(old, new)
    return nb



def used_names(tree) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def global_names(source: str) -> set[str]:
    """The global names a cell reads, in any of its scopes (a parameter named `tokenizer` is not
    the notebook's `tokenizer`)."""
    names, todo = set(), [symtable.symtable(python_source(source), "<cell>", "exec")]
    while todo:
        table = todo.pop()
        todo += table.get_children()
        module = table.get_type() == "module"
        names |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and (module or s.is_global())}
    return names


def bound_names(node) -> set[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | \
        {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def lean(nb):
    """`nb` (trimmed) with its imports cell cut to what the other cells use, as a student who
    deleted the rest: an import nothing uses goes, and so do the model's load and every statement
    that uses what it made, unless a kept cell uses one of those names. Other statements stay
    (lesson 08's TRITON_INTERPRET line, the seed). Grading never runs this cell outside the kernel
    (the verdict process runs the lesson's own imports), so this changes no verdict."""
    at = next(i for i, c in enumerate(nb.cells) if i >= 2 and c.cell_type == "code")
    imports = nb.cells[at]
    tree = parse(imports.source)
    if tree is None:
        return nb
    try:
        needed = set().union(*(global_names(c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code" and i != at))
    except SyntaxError:
        return nb
    model = set()                     # the model's load, then every statement using what it made
    made = set()
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "load_model") or used_names(node) & made:
            model.add(id(node))
            made |= bound_names(node)
    if made & needed:
        model = set()
    kept = []
    for node in reversed(tree.body):
        if id(node) in model or (isinstance(node, (ast.Import, ast.ImportFrom)) and not bound_names(node) & needed):
            continue
        kept.append(node)
        needed |= used_names(node)
    lines = imports.source.split("\n")
    imports.source = "\n".join("\n".join(lines[n.lineno - 1:n.end_lineno]) for n in reversed(kept))
    return nb


@functools.lru_cache(maxsize=None)
def checks_seeing(exercise: str) -> frozenset[str]:
    """The exercises whose check can reach `exercise`'s code: its own, and those whose cells (the
    exercise cells and the check cell) use a name its cells define, transitively (lesson 01's
    generate_naive calls sample, which calls apply_top_k). Any other check gets only objects that
    never touch the planted exercise's code."""
    number = PLANTED[exercise][0]
    the_plan, nb = plan(lesson(number)), honest(number)
    source = {c.get("id"): c.source for c in nb.cells}
    defines = {e: set() for e in EXERCISES[number]}
    uses = {e: set() for e in EXERCISES[number]}
    for cell_id, graded in the_plan.cells.items():
        for e in graded:
            defines[e] |= the_plan.names[cell_id]
            uses[e] |= used_names(parse(source[cell_id]))
    for c in nb.cells:
        if exercise_of(c):
            uses[exercise_of(c)] |= used_names(parse(c.source))
    seeing, todo = {exercise}, [exercise]
    while todo:
        reached = defines[todo.pop()]
        for e in EXERCISES[number]:
            if e not in seeing and uses[e] & reached:
                seeing.add(e)
                todo.append(e)
    return frozenset(seeing)


def planted_submission(*exercises: str):
    """The notebook a planted-bug student hands in: `planted(*exercises)` trimmed and lean, with
    the check cells of the exercises that cannot see the planted code deleted (a check of code the
    bug cannot reach would only cost seconds: they are reported "check cell missing")."""
    number, seeing = PLANTED[exercises[0]][0], set().union(*map(checks_seeing, exercises))
    nb = trim(planted(*exercises), number)
    nb.cells = [c for c in nb.cells if not exercise_of(c) or exercise_of(c) in seeing]
    return lean(nb)


@functools.lru_cache(maxsize=None)
def planted_students() -> dict[str, tuple[str, ...]]:
    """student -> the planted mistakes of their notebook: in each lesson, every mistake joins the
    first notebook whose mistakes no check sees together with it (`checks_seeing` sets disjoint,
    so each kept check cell can reach one mistake at most and decides as it would beside that
    mistake alone), else starts one; the student is named after them (`bug_sampler`,
    `bug_int8_quantizer+int4_quantizer`). Every mistake is still planted, each check still graded."""
    groups: list[list[str]] = []
    for exercise, (number, *_) in PLANTED.items():
        seeing = checks_seeing(exercise)
        group = next((g for g in groups if PLANTED[g[0]][0] == number
                      and not any(seeing & checks_seeing(e) for e in g)), None)
        if group is None:
            groups.append([exercise])
        else:
            group.append(exercise)
    return {"bug_" + "+".join(g): tuple(g) for g in groups}


def planted_student(exercise: str) -> str:
    """The student whose notebook holds `exercise`'s planted mistake."""
    return next(s for s, exercises in planted_students().items() if exercise in exercises)
