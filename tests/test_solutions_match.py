"""Each exercise's reference answer in solutions/ is the same code as its package counterpart.

Every exercise of the course exists twice: the answer learners compare against (in
`solutions/NN_name.ipynb`, between `# BEGIN SOLUTION` / `# END SOLUTION`) and the
reference implementation the package runs and the unit tests check. `EXERCISES` pairs
them up; each test parses both with `ast` (nothing is imported or executed) and asserts
the two function definitions are the same code: comments, docstrings, the function's
name and its decorators aside (the notebooks' classes and names differ). The whole
definition is compared, signature and the setup lines outside the markers included.

When a test fails it prints a unified diff of the two sides. Change one side to match
the other (and rebuild lessons/: `python -m minillm.course build`). A new exercise
needs its row here: `test_every_exercise_is_paired` fails until it has one.
"""
from __future__ import annotations

import ast
import copy
import difflib
from pathlib import Path

import nbformat
import pytest

from minillm.course.build import BEGIN

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"

# (notebook in solutions/, function in the notebook, package module, function in the module).
# A method is written Class.method on both sides.
EXERCISES = [
    ("00_setup_and_tour", "apply_rope", "minillm.models.llama", "apply_rope"),
    ("01_naive_generation", "apply_top_k", "minillm.sample.sampler", "apply_top_k"),
    ("01_naive_generation", "apply_top_p", "minillm.sample.sampler", "apply_top_p"),
    ("01_naive_generation", "sample", "minillm.sample.sampler", "sample"),
    ("01_naive_generation", "generate_naive", "minillm.baselines.naive_generation", "generate_naive"),
    ("02_kv_cache", "ContiguousKVCache.__init__", "minillm.kv.contiguous", "ContiguousKVCache.__init__"),
    ("02_kv_cache", "ContiguousKVCache.set_step", "minillm.kv.contiguous", "ContiguousKVCache.set_step"),
    ("02_kv_cache", "ContiguousKVCache.attend", "minillm.kv.contiguous", "ContiguousKVCache.attend"),
    ("02_kv_cache", "ContiguousKVCache.bytes_per_token", "minillm.kv.contiguous",
     "ContiguousKVCache.bytes_per_token"),
    ("02_kv_cache", "ContiguousKVCache.waste", "minillm.kv.contiguous", "ContiguousKVCache.waste"),
    ("03_paged_kv", "BlockAllocator.__init__", "minillm.kv.block_allocator", "BlockAllocator.__init__"),
    ("03_paged_kv", "BlockAllocator.num_free", "minillm.kv.block_allocator", "BlockAllocator.num_free"),
    ("03_paged_kv", "BlockAllocator.allocate", "minillm.kv.block_allocator", "BlockAllocator.allocate"),
    ("03_paged_kv", "BlockAllocator._check", "minillm.kv.block_allocator", "BlockAllocator._check"),
    ("03_paged_kv", "BlockAllocator.incref", "minillm.kv.block_allocator", "BlockAllocator.incref"),
    ("03_paged_kv", "BlockAllocator.free", "minillm.kv.block_allocator", "BlockAllocator.free"),
    ("03_paged_kv", "slot_mapping", "minillm.attention.paged", "slot_mapping"),
    ("03_paged_kv", "paged_attention", "minillm.attention.per_sequence", "paged_attention"),
    ("04_prefix_sharing", "block_hash", "minillm.kv.prefix_cache", "block_hash"),
    ("04_prefix_sharing", "PrefixCache.__init__", "minillm.kv.prefix_cache", "PrefixCache.__init__"),
    ("04_prefix_sharing", "PrefixCache.lookup", "minillm.kv.prefix_cache", "PrefixCache.lookup"),
    ("04_prefix_sharing", "PrefixCache.insert", "minillm.kv.prefix_cache", "PrefixCache.insert"),
    ("04_prefix_sharing", "PrefixCache.forget", "minillm.kv.prefix_cache", "PrefixCache.forget"),
    ("04_prefix_sharing", "PrefixCache.record", "minillm.kv.prefix_cache", "PrefixCache.record"),
    ("04_prefix_sharing", "PrefixCache.hit_rate", "minillm.kv.prefix_cache", "PrefixCache.hit_rate"),
    ("04_prefix_sharing", "CowBlockManager.append_slots", "minillm.kv.block_manager",
     "BlockManager.append_slots"),
    ("05_continuous_batching", "ContinuousScheduler.schedule", "minillm.engine.scheduler",
     "ContinuousBatchingScheduler.schedule"),
    ("06_preemption_and_swap", "PreemptingScheduler.pick_victim", "minillm.engine.scheduler",
     "Scheduler.pick_victim"),
    ("06_preemption_and_swap", "PreemptingScheduler._preempt", "minillm.engine.scheduler", "Scheduler._preempt"),
    ("06_preemption_and_swap", "SwappingBlockManager.swap_out", "minillm.kv.block_manager",
     "BlockManager.swap_out"),
    ("06_preemption_and_swap", "SwappingBlockManager.swap_in", "minillm.kv.block_manager",
     "BlockManager.swap_in"),
    ("07_serving", "MyDetokenizer.add", "minillm.text.detokenizer", "IncrementalDetokenizer.add"),
    ("07_serving", "MyDetokenizer.flush", "minillm.text.detokenizer", "IncrementalDetokenizer.flush"),
    ("07_serving", "MyDetokenizer.settled_text", "minillm.text.detokenizer", "IncrementalDetokenizer.settled_text"),
    ("07_serving", "MyStream.deliver", "minillm.server.async_engine", "RequestStream.deliver"),
    ("07_serving", "MyStream._outputs", "minillm.server.async_engine", "RequestStream._outputs"),
    ("07_serving", "MyStream.abort", "minillm.server.async_engine", "RequestStream.abort"),
    ("08_going_fast", "my_paged_decode_kernel", "minillm.attention.triton_decode", "paged_decode_kernel"),
    ("09_quantization", "quantize_int8", "minillm.quant.reference", "quantize_int8"),
    ("09_quantization", "dequantize_int8", "minillm.quant.reference", "dequantize_int8"),
    ("09_quantization", "quantize_int4", "minillm.quant.reference", "quantize_int4"),
    ("09_quantization", "dequantize_int4", "minillm.quant.reference", "dequantize_int4"),
    ("10_beyond_one_machine", "shard_decoder_layer", "minillm.distributed.sharding", "shard_decoder_layer"),
    ("10_beyond_one_machine", "choose_replica", "minillm.server.data_parallel.choice", "choose_replica"),
    ("10_beyond_one_machine", "balanced_partition", "minillm.distributed.partition", "balanced_partition"),
    ("11_speculative_decoding", "propose_ngram", "minillm.spec.ngram", "propose_ngram"),
    ("11_speculative_decoding", "verify", "minillm.spec.rejection", "verify"),
    ("12_structured_outputs", "apply_masks", "minillm.structured.matchers", "apply_masks"),
    ("12_structured_outputs", "MyStructuredOutputs.mask_logits", "minillm.structured.matchers",
     "StructuredOutputs.mask_logits"),
    ("12_structured_outputs", "MyStructuredOutputs.advance", "minillm.structured.matchers", "StructuredOutputs.advance"),
    ("12_structured_outputs", "MyChoiceConstraint.__init__", "minillm.structured.choice_trie",
     "ChoiceConstraint.__init__"),
    ("12_structured_outputs", "MyChoiceConstraint.allowed", "minillm.structured.choice_trie", "ChoiceConstraint.allowed"),
    ("12_structured_outputs", "MyChoiceConstraint.is_complete", "minillm.structured.choice_trie",
     "ChoiceConstraint.is_complete"),
    ("13_many_fine_tunes", "lora_delta", "minillm.lora.batched_delta", "gathered_delta"),
    ("13_many_fine_tunes", "chain_root", "minillm.kv.prefix_cache", "chain_root"),
]

FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)


def parse_cell(source: str, where: str) -> ast.Module:
    """A code cell as Python: IPython magics and shell lines (`%...`, `!...`) become blank
    lines, so line numbers still match the cell."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")]
    try:
        return ast.parse("\n".join(lines), filename=where)
    except SyntaxError as e:
        raise AssertionError(f"{where}: not valid Python: {e}") from e


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, definition) of every function in `tree`, methods as Class.method,
    nested functions as outer.inner."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, FUNCTION):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def marker_lines(source: str) -> list[int]:
    return [n for n, line in enumerate(source.split("\n"), start=1) if line.strip() == BEGIN]


def marked_functions(source: str, where: str) -> list[tuple[str, ast.AST]]:
    """The functions of a cell that hold solution markers (each marker counts for the
    innermost function around it). A marker outside every function is an error: such an
    exercise could not be paired with package code."""
    found = {}
    defs = list(functions(parse_cell(source, where)))
    for line in marker_lines(source):
        around = [(name, node) for name, node in defs if node.lineno <= line <= node.end_lineno]
        assert around, (f"{where}: '{BEGIN}' on line {line} is outside every function; an exercise "
                        "is a function (or method) body, paired with package code in EXERCISES")
        name, node = max(around, key=lambda item: item[1].lineno)     # the innermost
        found[name] = node
    return list(found.items())


def notebook_exercises() -> dict[tuple[str, str], tuple[str, ast.AST]]:
    """(notebook, function) -> (where, definition) for every marked function in solutions/."""
    out = {}
    for path in sorted(SOLUTIONS.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or not marker_lines(cell.source):
                continue
            where = f"solutions/{path.name}, cell {i} (id {cell.get('id', '?')})"
            for name, node in marked_functions(cell.source, where):
                key = (path.stem, name)
                assert key not in out, f"{where}: {name} is an exercise twice (also in {out[key][0]})"
                out[key] = (where, node)
    return out


def package_function(module: str, qualname: str) -> tuple[str, ast.AST]:
    rel = Path(*module.split(".")).with_suffix(".py")
    path = REPO / rel
    assert path.is_file(), f"{module}: no file {rel}"
    defs = dict(functions(ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))))
    assert qualname in defs, f"{rel}: no function {qualname}"
    return rel.as_posix(), defs[qualname]


def normalized(node: ast.AST, name: str) -> ast.AST:
    """The definition without its docstring and decorators, under `name` (a copy)."""
    node = copy.deepcopy(node)
    node.name, node.decorator_list = name, []
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:] or [ast.Pass()]
    node.body = body
    return node


_NOTEBOOK_EXERCISES = None


def exercises_in_notebooks():
    global _NOTEBOOK_EXERCISES
    if _NOTEBOOK_EXERCISES is None:
        _NOTEBOOK_EXERCISES = notebook_exercises()
    return _NOTEBOOK_EXERCISES


@pytest.mark.parametrize("notebook, name, module, qualname", EXERCISES,
                         ids=[f"{nb}.{name}" for nb, name, _, _ in EXERCISES])
def test_solution_matches_package(notebook, name, module, qualname):
    found = exercises_in_notebooks()
    assert (notebook, name) in found, (f"solutions/{notebook}.ipynb has no exercise {name} (no function "
                                       "of that name holds solution markers): update EXERCISES")
    where, nb_node = found[(notebook, name)]
    rel, pkg_node = package_function(module, qualname)
    short = qualname.rsplit(".", 1)[-1]
    ours, theirs = normalized(nb_node, short), normalized(pkg_node, short)
    if ast.dump(ours) == ast.dump(theirs):
        return
    diff = "\n".join(difflib.unified_diff(
        ast.unparse(ours).splitlines(), ast.unparse(theirs).splitlines(),
        fromfile=f"{where}: {name}", tofile=f"{rel}: {qualname}", lineterm=""))
    pytest.fail(f"the solution of {name} in solutions/{notebook}.ipynb and {module}.{qualname} have "
                f"drifted apart (comments, docstrings, names and decorators aside):\n{diff}",
                pytrace=False)


def test_every_exercise_is_paired():
    """Every function holding solution markers has a row in EXERCISES, and every row an exercise."""
    found = set(exercises_in_notebooks())
    listed = [(nb, name) for nb, name, _, _ in EXERCISES]
    assert len(listed) == len(set(listed)), "EXERCISES lists an exercise twice"
    missing = sorted(found - set(listed))
    stale = sorted(set(listed) - found)
    assert not missing, ("exercises in solutions/ with no package counterpart in EXERCISES "
                         f"(add a row: notebook, function, module, qualified name): {missing}")
    assert not stale, f"rows of EXERCISES with no marked function in solutions/: {stale}"


def test_normalization_ignores_form_only():
    """The comparison sees code, not comments, docstrings, names or decorators."""
    a = ast.parse('@deco\ndef f(x):\n    """doc"""\n    return x + 1  # note\n').body[0]
    b = ast.parse('def g(x):\n    return x + 1\n').body[0]
    c = ast.parse('def g(x):\n    return x + 2\n').body[0]
    assert ast.dump(normalized(a, "h")) == ast.dump(normalized(b, "h"))
    assert ast.dump(normalized(a, "h")) != ast.dump(normalized(c, "h"))
