"""The grading harness every lesson's graders share. `Grader` counts one check's cases,
turns a crash in the learner's code into a hint and prints the verdict; `expect` is an
`assert` that still checks under `python -O`; `fmt`, `expect_tensor` and
`expect_unchanged` phrase the complaints several graders make; `tiny_model` loads the
tiny random Llama once per session; `greedy_tie` applies the course's rule that greedy
outputs may part at a float-rounding tie. `grader` wraps every `check_*`: a failed check
is raised as `CheckFailed`, which a notebook shows as its message alone (no grader frames),
and `RESULTS` remembers the verdict so that a lesson's later cells can fall back to the
reference piece with `passed_or_reference` instead of failing in turn. It imports no
lesson module, so the lesson modules can be imported in any order.
"""
from __future__ import annotations

import functools
import importlib
from contextlib import contextmanager

import torch


class CheckFailed(AssertionError):
    """A grader's verdict: your piece is wrong, and `str(self)` says how.

    In a notebook it shows as one short message, without the grader's own frames:
    IPython renders an exception through its `_render_traceback_` when it has one."""

    def __init__(self, message: str, grader: str = "check"):
        super().__init__(message)
        self.grader = grader

    def _render_traceback_(self) -> list[str]:
        return [f"CheckFailed: {self}", f"({self.grader} did not pass: fix the exercise cell above, "
                "run it, then run this check again)"]


RESULTS: dict[str, bool] = {}
"""Grader name -> whether its latest run in this process passed (see `passed_or_reference`)."""


class Passed(int):
    """What a check returns when it passes: `== True` and true in an `if`, but a notebook cell
    that ends with the check shows nothing for it: the printed ✅ line is the verdict, with no
    stray `True` under it (IPython asks `_ipython_display_` before showing a cell's value)."""

    def __new__(cls):
        return super().__new__(cls, 1)

    def __repr__(self) -> str:
        return "True"

    __str__ = __repr__

    def _ipython_display_(self) -> None:
        """Nothing to add to the ✅ line."""


PASSED = Passed()


def grader(fn):
    """Make `fn` a grader: a failed check (AssertionError) is raised again as `CheckFailed`
    with the same message and no grader frames, and `RESULTS` records the verdict."""
    name = fn.__name__

    @functools.wraps(fn)
    def run(*args, **kwargs):
        __tracebackhide__ = True             # pytest: hide this frame too
        RESULTS[name] = False
        try:
            ok = fn(*args, **kwargs)
        except CheckFailed:
            raise
        except AssertionError as e:
            failed = CheckFailed(str(e), name)
            failed.original = e              # the full story, for whoever debugs a grader
            raise failed from None
        RESULTS[name] = True
        return PASSED if ok is True else ok

    return run


# grader -> the reference piece it compares yours with ("module:attribute")
REFERENCES = {
    "check_rope": "minillm.models.llama:apply_rope",
    "check_top_k": "minillm.sample.sampler:apply_top_k",
    "check_top_p": "minillm.sample.sampler:apply_top_p",
    "check_sampler": "minillm.sample.sampler:sample",
    "check_generate_naive": "minillm.baselines.naive_generation:generate_naive",
    "check_contiguous_cache": "minillm.kv.contiguous:ContiguousKVCache",
    "check_block_allocator": "minillm.kv.block_allocator:BlockAllocator",
    "check_slot_mapping": "minillm.attention.paged:slot_mapping",
    "check_paged_attention": "minillm.attention.per_sequence:paged_attention",
    "check_block_hash": "minillm.kv.prefix_cache:block_hash",
    "check_prefix_cache": "minillm.kv.prefix_cache:PrefixCache",
    "check_copy_on_write": "minillm.kv.block_manager:BlockManager",
    "check_scheduler": "minillm.engine.scheduler:ContinuousBatchingScheduler",
    "check_preemption": "minillm.engine.scheduler:Scheduler",
    "check_swap": "minillm.kv.block_manager:BlockManager",
    "check_detokenizer": "minillm.text.detokenizer:IncrementalDetokenizer",
    "check_request_stream": "minillm.server.async_engine:RequestStream",
    "check_paged_decode_kernel": "minillm.attention.triton_decode:paged_decode_kernel",
    "check_int8_quantizer": "minillm.quant.reference:quantize_int8",
    "check_int4_quantizer": "minillm.quant.reference:quantize_int4",
    "check_layer_sharding": "minillm.distributed.sharding:shard_decoder_layer",
    "check_router_choice": "minillm.server.data_parallel.choice:choose_replica",
    "check_balanced_partition": "minillm.distributed.partition:balanced_partition",
    "check_ngram_proposer": "minillm.spec.ngram:propose_ngram",
    "check_rejection_sampler": "minillm.spec.rejection:verify",
    "check_structured_outputs": "minillm.structured.matchers:StructuredOutputs",
    "check_choice_constraint": "minillm.structured.choice_trie:ChoiceConstraint",
    "check_lora_delta": "minillm.lora.batched_delta:gathered_delta",
    "check_chain_root": "minillm.kv.prefix_cache:chain_root",
}

# grader -> package functions that answer part of its exercise beside the reference ("module:attribute"):
# the exercise cell writes them too (lesson 12's mask_logits calls the notebook's own apply_masks), so
# calling the package's from the notebook fails the exercise as a call of the reference would
PART_ANSWERS = {
    "check_structured_outputs": ("minillm.structured.matchers:apply_masks",),
    "check_lora_delta": ("minillm.lora.batched_delta:grouped_delta", "minillm.lora.batched_delta:row_deltas"),
}


def passed_or_reference(yours, check: str):
    """`yours` when its grader `check` passed in this session, else the reference piece,
    with a printed note: a lesson's later cells then still run (and show the real engine)
    instead of failing one after another on an exercise that is not done yet."""
    if RESULTS.get(check):
        return yours
    module, attribute = REFERENCES[check].split(":")
    reference = getattr(importlib.import_module(module), attribute)
    name = getattr(yours, "__name__", type(yours).__name__)
    state = "has not been checked yet" if check not in RESULTS else f"did not pass {check}"
    print(f"note: your {name} {state}; this cell uses the reference "
          f"{module}.{attribute} instead (fix your {name}, run its check, then this cell again)")
    return reference


@contextmanager
def references_standing_in(fn, names: dict[str, str]):
    """While the block runs, the global names `names` (name -> the grader of that exercise, e.g.
    {"apply_top_p": "check_top_p"}) of `fn`'s module (a notebook's globals) are the references:
    one exercise is then checked alone, and a mistake in another exercise it calls (a stub still
    raising NotImplementedError) fails only that other exercise. Names `fn`'s globals do not
    hold are left alone; every name is put back afterwards."""
    space = getattr(fn, "__globals__", None)
    saved = {}
    if isinstance(space, dict):
        for name, check in names.items():
            if name in space:
                module, attribute = REFERENCES[check].split(":")
                saved[name] = space[name]
                space[name] = getattr(importlib.import_module(module), attribute)
    try:
        yield
    finally:
        for name, value in saved.items():
            space[name] = value


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

    def passed(self) -> Passed:
        print(f"✅ {self.name} passed ({self.cases} cases)")
        return PASSED


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
    from ..baselines.naive_generation import next_token_logits_naive
    i = next((j for j, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
    if i is None:
        return False
    logits = next_token_logits_naive(model, prompt_ids + reference[:i])
    top = logits.max()
    return max(float(top - logits[ours[i]]), float(top - logits[reference[i]])) <= 1e-3
