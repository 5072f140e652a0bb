"""The engine never changes a model another engine uses: each runs its own module tree
(runner/engine_model.py). Engines built on ONE model object (float, int8, compiled) each give
the tokens they give alone, in any order, and the handed model is left as it was."""
import pytest
import torch

from minillm import LLMEngine, SamplingParams
from minillm.models import load_model
from minillm.runner.engine_model import own_module_tree

PROMPTS = [[5, 6, 7, 8], list(range(40, 52))]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
OPTIONS = dict(block_size=4, num_kv_blocks=32, max_model_len=48, max_num_seqs=2)
KINDS = {"float": {}, "int8": {"quantization": "int8"}, "compiled": {"compile": True}}


def tokens(engine):
    """Greedy tokens and their logprobs (these tell int8 from float even where the tokens agree)."""
    outs = [o.outputs[0] for o in engine.generate(PROMPTS, PARAMS)]
    return [(o.token_ids, [step[t].logprob for step, t in zip(o.logprobs, o.token_ids)]) for o in outs]


def same(a, b) -> bool:
    return all(ta == tb and max(abs(x - y) for x, y in zip(la, lb)) < 1e-5 for (ta, la), (tb, lb) in zip(a, b))


@pytest.fixture(scope="module")
def alone():
    """Each kind's tokens on a model of its own."""
    out = {}
    for kind, extra in KINDS.items():
        model, tokenizer = load_model("tiny-llama", device="cpu")
        out[kind] = tokens(LLMEngine(model, tokenizer, **OPTIONS, **extra))
    assert not same(out["int8"], out["float"]), "int8 should change the logprobs, or the test shows nothing"
    return out


def snapshot(model):
    return {name: t.clone() for name, t in model.state_dict().items()}, [type(m) for m in model.modules()]


@pytest.mark.parametrize("order", [["float", "int8", "compiled"], ["int8", "compiled", "float"]])
def test_engines_on_one_model_give_their_own_tokens_in_any_order(alone, order):
    model, tokenizer = load_model("tiny-llama", device="cpu")
    weights, module_types = snapshot(model)
    engines = {kind: LLMEngine(model, tokenizer, **OPTIONS, **KINDS[kind]) for kind in order}
    for kind in order + order[::-1]:
        assert same(tokens(engines[kind]), alone[kind]), kind
    after_weights, after_types = snapshot(model)
    assert after_types == module_types and getattr(model, "quantization", None) is None
    assert all(torch.equal(after_weights[k], w) for k, w in weights.items())
    assert not engines["compiled"].runner.run_decode.__self__.failed


def test_the_own_tree_shares_weights_and_keeps_ties():
    model, _ = load_model("tiny-llama", device="cpu")
    own = own_module_tree(model)
    assert own is not model and own.model.layers[0] is not model.model.layers[0]
    for (name, mine), (_, theirs) in zip(own.named_parameters(), model.named_parameters()):
        assert mine is not theirs and mine.data_ptr() == theirs.data_ptr(), name      # no weight copied
    if model.config.tie_word_embeddings:
        assert own.lm_head.weight is own.model.embed_tokens.weight
    own.to(torch.bfloat16)
    assert next(model.parameters()).dtype == torch.float32          # converting the copy left the model


def test_an_engine_in_another_dtype_leaves_the_model_alone():
    model, tokenizer = load_model("tiny-llama", device="cpu")
    engine = LLMEngine(model, tokenizer, dtype="bfloat16", **OPTIONS)
    assert engine.model.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert engine.stats()["config"]["dtype"] == "bfloat16"
