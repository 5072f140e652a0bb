"""Tests of the graders of lesson 13 (minillm.checks.lesson13_delta, lesson13_cache_key).

The references pass each one, and the issue's planted mistakes (the scaling alpha / r forgotten,
the wrong row's adapter, base rows given an adapter, the key without the adapter) and the other
likely ones are rejected with a hint that names the mistake. Addressable per lesson task:
`pytest -k check_lora_delta`, `pytest -k check_chain_root`.
"""
import hashlib

import pytest
import torch
from checks_support import rejects

from minillm import checks
from minillm.kv.prefix_cache import chain_root
from minillm.lora.batched_delta import gathered_delta, grouped_delta


# ---------------------------------------------------------------- exercise (a): the batched delta

def per_row_loop(x, A, B, scale, slot_of_row):
    """A correct answer of another shape: a Python loop over the rows, (B @ A) first."""
    out = torch.zeros(x.shape[0], B.shape[1])
    for t, s in enumerate(slot_of_row.tolist()):
        if s >= 0:
            out[t] = scale[s] * ((B[s] @ A[s]) @ x[t].float())
    return out


def unscaled(x, A, B, scale, slot_of_row):
    idx = slot_of_row.clamp(min=0)
    keep = (slot_of_row >= 0).float().unsqueeze(1)
    return torch.bmm(B[idx], torch.bmm(A[idx], x.float().unsqueeze(2))).squeeze(2) * keep


def base_rows_get_slot_0(x, A, B, scale, slot_of_row):
    idx = slot_of_row.clamp(min=0)
    return torch.bmm(B[idx], torch.bmm(A[idx], x.float().unsqueeze(2))).squeeze(2) * scale[idx].unsqueeze(1)


def base_rows_get_the_last_slot(x, A, B, scale, slot_of_row):
    return torch.stack([scale[s] * (B[s] @ (A[s] @ x[t].float())) for t, s in enumerate(slot_of_row.tolist())])


def row_index_as_slot(x, A, B, scale, slot_of_row):
    out = torch.zeros(x.shape[0], B.shape[1])
    for t, s in enumerate(slot_of_row.tolist()):
        if s >= 0:
            j = t % A.shape[0]
            out[t] = scale[j] * (B[j] @ (A[j] @ x[t].float()))
    return out


def first_slot_scale(x, A, B, scale, slot_of_row):
    return gathered_delta(x, A, B, scale[:1].expand_as(scale), slot_of_row)


def in_the_input_dtype(x, A, B, scale, slot_of_row):
    return gathered_delta(x, A, B, scale, slot_of_row).to(x.dtype)


def in_place_on_x(x, A, B, scale, slot_of_row):
    out = gathered_delta(x, A, B, scale, slot_of_row)
    x.zero_()
    return out


def transposed(x, A, B, scale, slot_of_row):
    return gathered_delta(x, A, B, scale, slot_of_row).t()


@pytest.mark.parametrize("fn", [gathered_delta, grouped_delta, per_row_loop])
def test_check_lora_delta_passes_correct_answers(fn):
    assert checks.check_lora_delta(fn)


@pytest.mark.parametrize("bad, hint", [
    (unscaled, "without the scaling.*lora_alpha / r"),
    (base_rows_get_slot_0, "base-model row, but its delta is slot 0's adapter \\(clamping -1 to 0"),
    (base_rows_get_the_last_slot, "base-model row, but its delta is slot 1's adapter \\(A\\[-1\\] is the last slot"),
    (row_index_as_slot, "got slot \\d's adapter: each row takes A and B of its own slot"),
    (first_slot_scale, "but slot 0's scale: each slot has its own scale"),
    (in_the_input_dtype, "compute the delta in float32"),
    (in_place_on_x, "changed its x"),
    (transposed, "expected \\[1, 5\\]|returned shape"),
], ids=lambda v: getattr(v, "__name__", "hint"))
def test_check_lora_delta_rejects_planted_mistakes(bad, hint):
    rejects(checks.check_lora_delta, bad, hint)


def test_check_lora_delta_names_a_stub():
    def stub(x, A, B, scale, slot_of_row):
        raise NotImplementedError("YOUR CODE HERE")
    rejects(checks.check_lora_delta, stub, "not implemented yet")


# ---------------------------------------------------------------- exercise (b): the key knows the adapter

def without_the_adapter(seq):
    return None


def by_name(seq):
    lora = seq.lora_request
    return None if lora is None else hashlib.sha256(lora.lora_name.encode()).digest()


def salted(seq):
    lora = seq.lora_request
    return None if lora is None else str(hash((lora.lora_int_id, lora.lora_path))).encode()


def by_object(seq):
    lora = seq.lora_request
    return None if lora is None else str(id(lora)).encode()


def by_sequence(seq):
    lora = seq.lora_request
    return None if lora is None else hashlib.sha256(f"{lora.lora_int_id}:{seq.prompt_token_ids}".encode()).digest()


def base_salted_too(seq):
    lora = seq.lora_request
    return hashlib.sha256(b"base" if lora is None else lora.cache_salt).digest()


def an_int(seq):
    lora = seq.lora_request
    return None if lora is None else lora.lora_int_id


def by_id_only(seq):
    lora = seq.lora_request
    return None if lora is None else f"lora:{lora.lora_int_id}".encode()


@pytest.mark.parametrize("fn", [chain_root, by_id_only])
def test_check_chain_root_passes_correct_answers(fn):
    assert checks.check_chain_root(fn)


@pytest.mark.parametrize("bad, hint", [
    (without_the_adapter, "the key is without the adapter"),
    (by_name, "two adapters may share a name"),
    (salted, "built-in hash\\(\\), which is salted"),
    (by_object, "no id\\(\\)"),
    (by_sequence, "not the sequence, its tokens"),
    (base_salted_too, "the base model's chain starts at None"),
    (an_int, "return bytes"),
], ids=lambda v: getattr(v, "__name__", "hint"))
def test_check_chain_root_rejects_planted_mistakes(bad, hint):
    rejects(checks.check_chain_root, bad, hint)


# ---------------------------------------------------------------- the lesson's seams in the real engine

@pytest.fixture(scope="module")
def tiny_with_adapters(tmp_path_factory):
    pytest.importorskip("peft")
    from lora_support import make_adapter

    from minillm.checks.harness import tiny_model
    from minillm.lora import LoRARequest
    from minillm.models.reference import transformers_twin
    model, tok = tiny_model()
    root = tmp_path_factory.mktemp("lesson13")
    loras = []
    for i, targets in enumerate((["k_proj", "v_proj"], ["q_proj", "gate_proj", "down_proj"])):
        make_adapter(transformers_twin(model), root / f"a{i}", targets, 4, 8, False, seed=i)
        loras.append(LoRARequest(f"a{i}", i + 1, str(root / f"a{i}")))
    return model, tok, loras


def test_plugged_delta_and_chain_root_run_in_the_engine(tiny_with_adapters):
    """The lesson plugs its pieces in: plugged_delta's function computes every LoRA linear's delta
    (same tokens as the package's), a BlockManager's chain_root names the first block's parent, and
    a root without the adapter lets a prompt cached under one adapter be reused for another."""
    from minillm import LLMEngine, SamplingParams
    from minillm.kv.block_manager import BlockManager
    from minillm.lora.batched_delta import plugged_delta
    model, tok, (a, b) = tiny_with_adapters
    prompt = [1, 1597, 314, 2048, 21, 5, 99, 1000, 44, 17, 23, 4000]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    options = dict(enable_lora=True, max_loras=2, max_lora_rank=4, num_kv_blocks=64, block_size=4)
    calls = []

    def counted(*args):
        calls.append(1)
        return gathered_delta(*args)

    engine = LLMEngine(model, tok, **options)
    want = [o.outputs[0].token_ids for o in engine.generate([prompt] * 3, greedy, lora_request=[None, a, b])]
    with plugged_delta(counted):
        got = [o.outputs[0].token_ids for o in LLMEngine(model, tok, **options).generate(
            [prompt] * 3, greedy, lora_request=[None, a, b])]
    assert calls and got == want and len({tuple(t) for t in want}) == 3

    class NoAdapterKey(BlockManager):
        def chain_root(self, seq):
            return None

    for cls, shared in ((BlockManager, False), (NoAdapterKey, True)):
        engine = LLMEngine(model, tok, block_manager_cls=cls, **options)
        engine.generate([prompt], greedy, lora_request=a)
        second = engine.generate([prompt], greedy, lora_request=b)[0]
        assert (second.num_cached_tokens > 0) == shared, cls.__name__
        assert (second.outputs[0].token_ids == want[2]) != shared, "b on a's K/V answers otherwise"
    with pytest.raises(TypeError, match="plugged_delta takes a function"):
        with plugged_delta(None):
            pass
