"""The graders as a package (minillm.checks): every grader importable from the package and
from its lesson's module, in any import order, and the shared engine stage that fails
instead of hanging.
"""
import subprocess
import sys

import pytest

from minillm import checks
from minillm.checks import engine_runs, harness

GRADER_MODULES = {
    "lesson00": ["check_rope"],
    "lesson01_sampling": ["check_top_k", "check_top_p", "check_sampler"],
    "lesson01_generation": ["check_generate_naive"],
    "lesson02": ["check_contiguous_cache"],
    "lesson03": ["check_block_allocator", "check_slot_mapping"],
    "lesson03_attention": ["check_paged_attention"],
    "lesson04_prefix_cache": ["check_block_hash", "check_prefix_cache"],
    "lesson04_copy_on_write": ["check_copy_on_write"],
    "lesson05": ["check_scheduler"],
    "lesson06": ["check_preemption", "check_swap"],
    "lesson07_detokenizer": ["check_detokenizer"],
    "lesson07_stream": ["check_request_stream"],
    "lesson08": ["check_paged_decode_kernel"],
    "lesson09_int8": ["check_int8_quantizer"],
    "lesson09_int4": ["check_int4_quantizer"],
    "lesson10_sharding": ["check_layer_sharding"],
    "lesson10_router": ["check_router_choice"],
    "lesson10_partition": ["check_balanced_partition"],
    "lesson11_ngram": ["check_ngram_proposer"],
    "lesson11_rejection": ["check_rejection_sampler"],
    "lesson12_masks": ["check_structured_outputs"],
    "lesson12_choice": ["check_choice_constraint"],
    "lesson13_delta": ["check_lora_delta"],
    "lesson13_cache_key": ["check_chain_root"],
}


def test_graders_are_importable_from_checks_and_their_own_module():
    import importlib

    from minillm.checks import check_block_allocator, check_swap
    from minillm.checks.lesson03 import check_block_allocator as from_lesson03
    from minillm.checks.lesson06 import check_swap as from_lesson06
    assert check_block_allocator is from_lesson03 and check_swap is from_lesson06
    graders = [name for names in GRADER_MODULES.values() for name in names]
    assert sorted(checks.__all__) == sorted(graders) and len(graders) == 29
    for module, names in GRADER_MODULES.items():
        lesson = importlib.import_module(f"minillm.checks.{module}")
        for name in names:
            assert getattr(checks, name) is getattr(lesson, name)


@pytest.mark.parametrize("first", ["minillm.checks.lesson06", "minillm.checks.harness", "minillm.checks"])
def test_graders_import_in_any_order(first):
    script = (f"import {first}\n"
              "from minillm.checks import check_rope, check_top_p, check_swap\n"
              "import minillm.checks.lesson06 as l6\n"
              "assert check_swap is l6.check_swap\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- the engine stage of every grader

def test_engine_stage_fails_instead_of_hanging_on_a_scheduler_that_never_schedules():
    from minillm.engine.scheduler import Scheduler, SchedulerOutput

    class Idle(Scheduler):
        def schedule(self):
            return SchedulerOutput()

    g = harness.Grader("check_scheduler", "your schedule()")
    engine = engine_runs.make_engine(g, "scheduler_cls=Idle", scheduler_cls=Idle, num_kv_blocks=8, block_size=4)
    with pytest.raises(AssertionError, match=r"did not finish 2 short requests in 20 steps \(2 waiting, 0 running"):
        engine_runs.drive(g, engine, ["Hi", "Hello"], engine_runs.GREEDY, "scheduler_cls=Idle", "stuck",
                          max_steps=20)


# ---------------------------------------------------------------- what a learner sees when a check fails

def test_a_failed_check_is_its_message_alone_in_a_notebook():
    from minillm.checks import CheckFailed, check_slot_mapping

    def wrong(block_table, positions, block_size):
        return [block_table[p // block_size] + p % block_size for p in positions]
    with pytest.raises(CheckFailed) as err:
        check_slot_mapping(wrong)
    assert isinstance(err.value, AssertionError) and err.value.grader == "check_slot_mapping"
    shown = err.value._render_traceback_()                 # what IPython prints instead of a traceback
    assert shown[0] == f"CheckFailed: {err.value}" and len(shown) == 2
    assert "contextlib" not in "\n".join(shown) and "harness.py" not in "\n".join(shown)
    assert err.value.__suppress_context__                  # no "During handling..." chain in a plain traceback


def test_later_cells_fall_back_to_the_reference_until_the_check_passes(capsys):
    from minillm.checks import check_slot_mapping, passed_or_reference
    from minillm.attention.paged import slot_mapping as reference

    def stub(block_table, positions, block_size):
        raise NotImplementedError("YOUR CODE HERE")
    with pytest.raises(AssertionError, match="not implemented yet"):
        check_slot_mapping(stub)
    assert passed_or_reference(stub, "check_slot_mapping") is reference
    assert "note: your stub did not pass check_slot_mapping; this cell uses the reference" in capsys.readouterr().out
    check_slot_mapping(reference)
    capsys.readouterr()
    assert passed_or_reference(stub, "check_slot_mapping") is stub        # the latest verdict counts
    assert capsys.readouterr().out == ""


def test_every_grader_has_a_reference_to_fall_back_on():
    import importlib
    graders = [name for names in GRADER_MODULES.values() for name in names]
    assert set(graders) <= set(harness.REFERENCES)
    for name in harness.REFERENCES:
        module, attribute = harness.REFERENCES[name].split(":")
        assert callable(getattr(importlib.import_module(module), attribute))


def test_check_block_hash_rejects_pythons_salted_hash():
    from minillm.checks import check_block_hash

    def builtin(parent, token_ids):
        return hash((parent, str(token_ids)))
    with pytest.raises(AssertionError, match="salted"):
        check_block_hash(builtin)

    def dunder(parent, token_ids):                     # the same salt, without naming hash()
        return (str(parent) + str(token_ids)).__hash__()
    with pytest.raises(AssertionError, match="fresh Python process"):
        check_block_hash(dunder)


LESSON01_STUBBED_TOP_P = '''
import torch
from minillm.sample.sampler import make_generator

def apply_top_k(logits, top_k):
    raise NotImplementedError("YOUR CODE HERE")

def apply_top_p(logits, top_p):
    raise NotImplementedError("YOUR CODE HERE")

def sample(logits, params, generators):
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = apply_top_p(apply_top_k(logits[i] / p.temperature, p.top_k), p.top_p)
        tokens[i] = torch.multinomial(row.softmax(dim=-1), 1, generator=generators[i])[0]
    return tokens

def broken_sample(logits, params, generators):
    raise NotImplementedError("YOUR CODE HERE")
'''


def test_one_mistake_fails_one_exercise_the_references_stand_in_for_the_others():
    """Lesson 01: a stubbed top-k/top-p fails their own checks only; sample is checked with the
    reference top-k/top-p, generate_naive with the reference sampler; the notebook's names are
    put back afterwards."""
    from minillm.baselines import naive_generation
    ns = {}
    exec(compile(LESSON01_STUBBED_TOP_P, "<notebook cell 1>", "exec"), ns)
    stub = ns["apply_top_p"]
    assert checks.check_sampler(ns["sample"])
    assert ns["apply_top_p"] is stub
    with pytest.raises(checks.CheckFailed, match="not implemented"):
        checks.check_top_p(ns["apply_top_p"])
    with harness.references_standing_in(ns["sample"], {"sample": "check_sampler"}):
        assert ns["sample"] is not ns["broken_sample"] and ns["sample"].__module__ == "minillm.sample.sampler"
    assert ns["sample"].__code__.co_filename == "<notebook cell 1>"
    assert naive_generation  # the reference module the lesson's generate_naive check runs against


def test_a_passing_check_returns_true_and_a_notebook_cell_shows_only_its_verdict_line():
    """A check cell's last expression is the check: Jupyter shows the ✅ line it prints and
    no stray `True` under it, while a caller still gets a value equal to True."""
    import nbformat
    from nbclient import NotebookClient

    from minillm.models.llama import apply_rope

    result = checks.check_rope(apply_rope)
    assert result == True and bool(result) and repr(result) == "True"        # noqa: E712
    assert result is harness.PASSED
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from minillm.checks import check_rope\nfrom minillm.models.llama import apply_rope\n"
        "check_rope(apply_rope)")])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["stream"], outputs       # no execute_result: no `True`
    assert outputs[0].text.startswith("✅ check_rope passed")
