"""Batched multi-LoRA (minillm/lora/, issue 36): adapters made in-process with peft on the tiny
model, served in one mixed batch, token-exact against transformers + peft (PeftModel, unmerged)."""
from __future__ import annotations

import json

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.checks.harness import tiny_model
from minillm.lora import LoRARequest, gathered_delta, grouped_delta
from minillm.models.reference import compare_greedy, transformers_twin

peft = pytest.importorskip("peft")
from lora_support import make_adapter  # noqa: E402 (after the skip)

# (name, target modules, rank, alpha, rsLoRA): every linear is adapted by one of them, ranks differ
ADAPTERS = [("qv", ["q_proj", "v_proj"], 4, 8, False),
            ("mlp", ["gate_proj", "down_proj"], 8, 16, True),
            ("all", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 2, 4, False)]
PROMPTS = [[1, 1597, 314, 2048, 21, 5, 99, 1000, 44], [1, 17, 23, 4000, 560, 2], [1, 9, 9, 9, 300, 301, 302, 303]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def tiny():                     # the tiny Llama only (conftest's `tiny` runs three architectures)
    return tiny_model()


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory):
    """{name: (folder, reference tokens per prompt from transformers + peft, unmerged)}, plus the base's."""
    model, _ = tiny
    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for seed, (name, targets, r, alpha, rslora) in enumerate(ADAPTERS):
        make_adapter(transformers_twin(model), root / name, targets, r, alpha, rslora, seed)
        ref = peft.PeftModel.from_pretrained(transformers_twin(model), root / name).eval()
        out[name] = (str(root / name), ref)
    out[None] = (None, transformers_twin(model))
    return out


def reference_tokens(hf, prompt):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    return gen[0, len(prompt):].tolist()


def lora_requests(adapters):
    return {name: LoRARequest(name, i + 1, adapters[name][0]) for i, (name, *_) in enumerate(ADAPTERS)}


def run(llm, jobs):
    """jobs: [(prompt, LoRARequest or None)] in one generate call -> token lists."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in jobs], params, use_tqdm=False,
                        lora_request=[lora for _, lora in jobs])
    return outs


def check_against_peft(adapters, jobs, outs):
    for (prompt, lora), out in zip(jobs, outs):
        hf = adapters[None if lora is None else lora.lora_name][1]
        ours = out.outputs[0].token_ids
        compare_greedy(hf, prompt, list(ours), reference_tokens(hf, prompt))


def test_mixed_batch_matches_peft_per_adapter(tiny, adapters):
    model, tok = tiny
    loras = lora_requests(adapters)
    jobs = [(p, lora) for p in PROMPTS for lora in [None, *loras.values()]]
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=4, max_lora_rank=8, num_kv_blocks=256)
    outs = run(llm, jobs)
    check_against_peft(adapters, jobs, outs)
    base = {tuple(o.outputs[0].token_ids) for (p, lora), o in zip(jobs, outs) if p == PROMPTS[0]}
    assert len(base) == 4, "each adapter changes the answer (else the test could not tell them apart)"
    # logprobs: the chosen token's logprob equals peft's on the prompt + generated tokens
    (prompt, lora), out = jobs[3], outs[3]
    hf = adapters[lora.lora_name][1]
    ids = torch.tensor([prompt + list(out.outputs[0].token_ids)])
    with torch.inference_mode():
        ref = torch.log_softmax(hf(ids).logits[0].float(), -1)
    for i, (token, lp) in enumerate(zip(out.outputs[0].token_ids, out.outputs[0].logprobs)):
        assert abs(lp[token].logprob - float(ref[len(prompt) - 1 + i, token])) < 1e-3


def test_cache_isolation_and_slot_starvation(tiny, adapters):
    """The same prompt under A, then B (prefix cache on): B's answer. max_loras=1 with three
    adapters in one batch: each request still gets its own adapter's tokens."""
    model, tok = tiny
    loras = lora_requests(adapters)
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=1, max_lora_rank=8, num_kv_blocks=256,
              block_size=4)
    long = PROMPTS[0] * 3
    for lora in (loras["qv"], loras["mlp"], None, loras["all"]):
        jobs = [(long, lora)]
        check_against_peft(adapters, jobs, run(llm, jobs))
    jobs = [(p, lora) for p in PROMPTS[:2] for lora in [*loras.values(), None]]
    check_against_peft(adapters, jobs, run(llm, jobs))
    assert llm.llm_engine.lora.slots.num_evictions >= 2
    # n > 1: the forked samples run under their parent's adapter
    prompt, lora = PROMPTS[1], loras["all"]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(n=2, temperature=0.0, max_tokens=MAX_TOKENS,
                       ignore_eos=True), use_tqdm=False, lora_request=lora)[0]
    want = reference_tokens(adapters["all"][1], prompt)
    assert [list(o.token_ids) for o in out.outputs] == [want, want]


def test_batched_delta_two_ways_agree():
    g = torch.Generator().manual_seed(0)
    x, A, B = torch.randn(7, 5, generator=g), torch.randn(3, 2, 5, generator=g), torch.randn(3, 4, 2, generator=g)
    scale, slots = torch.tensor([0.5, 2.0, 1.0]), torch.tensor([0, -1, 2, 0, 1, -1, 2])
    want = torch.stack([torch.zeros(4) if s < 0 else scale[s] * B[s] @ (A[s] @ x[i]) for i, s in enumerate(slots)])
    torch.testing.assert_close(grouped_delta(x, A, B, scale, slots), want)
    torch.testing.assert_close(gathered_delta(x, A, B, scale, slots), want)


def _rewrite_config(folder, tmp_path, **changes):
    import shutil
    dst = tmp_path / "changed"
    shutil.copytree(folder, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_bad_adapters_are_refused_by_name(tiny, adapters, tmp_path):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=1, max_lora_rank=4, num_kv_blocks=64)
    good = adapters["qv"][0]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text("{not json")
    cases = [(str(tmp_path / "nowhere"), "lora_path"),
             (str(tmp_path / "broken"), "adapter_config.json"),
             (adapters["mlp"][0], "max_lora_rank"),                        # r=8 > 4
             (_rewrite_config(good, tmp_path / "a", use_dora=True), "use_dora"),
             (_rewrite_config(good, tmp_path / "b", bias="all"), "bias"),
             (_rewrite_config(good, tmp_path / "c", modules_to_save=["lm_head"]), "modules_to_save"),
             (_rewrite_config(good, tmp_path / "d", target_modules=["q_proj", "c_attn"]), "c_attn")]
    for i, (path, field) in enumerate(cases):
        with pytest.raises(ValueError, match=field):
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False,
                         lora_request=LoRARequest("bad", 10 + i, path))
    with pytest.raises(ValueError, match="enable_lora"):
        LLM(model, tokenizer=tok, num_kv_blocks=64).generate(
            [{"prompt_token_ids": [1, 2, 3]}], use_tqdm=False,
            lora_request=LoRARequest("qv", 1, good))
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False,
                       lora_request=LoRARequest("qv", 1, good))
    assert len(out[0].outputs[0].token_ids) == 2, "the engine keeps serving after refusals"


@pytest.mark.parametrize("options", [
    dict(max_num_batched_tokens=8, num_kv_blocks=14, block_size=4, preemption_mode="recompute"),
    dict(max_num_batched_tokens=8, num_kv_blocks=14, block_size=4, preemption_mode="swap"),
    dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}, num_kv_blocks=256)],
    ids=["chunked-preempt-recompute", "chunked-preempt-swap", "ngram-speculation"])
def test_lora_with_chunked_prefill_preemption_and_ngram_speculation(tiny, adapters, options):
    """A small token budget (prompts in chunks) and a pool too small for every request at once
    (preemption), or n-gram drafts verified by the adapted model: each request's tokens are still its adapter's."""
    model, tok = tiny
    loras = lora_requests(adapters)
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=2, max_lora_rank=8, **options)
    jobs = [(p * 2, lora) for p in PROMPTS for lora in [None, *loras.values()]]
    check_against_peft(adapters, jobs, run(llm, jobs))
    if "preemption_mode" in options:
        assert llm.llm_engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    else:
        assert llm.llm_engine.speculator.num_proposed > 0, "drafts were meant to be verified"


def test_unsupported_combinations_are_refused_by_name(tiny):
    model, tok = tiny
    for options, name in [(dict(quantization="int8"), "quantization"), (dict(compile=True), "compile"),
                          (dict(speculative_config={"method": "self_draft", "num_speculative_tokens": 2}), "self_draft")]:
        with pytest.raises(ValueError, match=f"enable_lora=True with .*{name}"):
            LLM(model, tokenizer=tok, enable_lora=True, num_kv_blocks=64, **options)


@pytest.mark.slow
def test_smollm2_mixed_batch_matches_peft(smol, tmp_path):
    """The embedded SmolLM2-135M with two adapters (attention only, rank 8; every linear, rank 4,
    rsLoRA) and the base in one batch: each request's greedy tokens are transformers + peft's."""
    model, tok, _ = smol
    specs = [("attn", ["q_proj", "k_proj", "v_proj", "o_proj"], 8, 16, False),
             ("every", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 4, 8, True)]
    loras = {}
    for i, (name, targets, r, alpha, rslora) in enumerate(specs):
        make_adapter(transformers_twin(model), tmp_path / name, targets, r, alpha, rslora, seed=10 + i)
        loras[name] = LoRARequest(name, i + 1, str(tmp_path / name))
    prompts = [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):")]
    jobs = [(p, lora) for p in prompts for lora in [None, *loras.values()]]
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=64)
    outs = run(llm, jobs)
    hf = peft.PeftModel.from_pretrained(transformers_twin(model), tmp_path / "attn", adapter_name="attn").eval()
    hf.load_adapter(tmp_path / "every", adapter_name="every")
    for (prompt, lora), out in zip(jobs, outs):
        if lora is None:
            with hf.disable_adapter():
                want = reference_tokens(hf, prompt)
        else:
            hf.set_adapter(lora.lora_name)
            want = reference_tokens(hf, prompt)
        compare_greedy(hf, prompt, list(out.outputs[0].token_ids), want)
    assert len({tuple(o.outputs[0].token_ids) for o in outs[:3]}) == 3, "the adapters change the answer"
