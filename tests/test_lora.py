"""Batched multi-LoRA (minillm/lora/, issue 36): adapters made in-process with peft on the tiny
model, served in one mixed batch, token-exact against transformers + peft (PeftModel, unmerged)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.checks.harness import tiny_model
from minillm.lora import LoRARequest, gathered_delta, grouped_delta
from minillm.lora import synthetic
from minillm.lora.adapter import load_adapter
from minillm.lora.packed_delta import LONG_SLOT, StepLayout, packed_delta
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


@pytest.mark.parametrize("delta", ["grouped", "packed"])
def test_mixed_batch_matches_peft_per_adapter(tiny, adapters, delta):
    """Both ways of adding the deltas (manager.DELTAS); the prompts' first step puts more than
    LONG_SLOT rows on each adapter, so the packed path runs both its block and its lone slots."""
    model, tok = tiny
    loras = lora_requests(adapters)
    jobs = [(p * 2, lora) for p in PROMPTS for lora in [None, *loras.values()]]
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=4, max_lora_rank=8, num_kv_blocks=256)
    llm.llm_engine.lora.use_delta(delta)
    outs = run(llm, jobs)
    check_against_peft(adapters, jobs, outs)
    base = {tuple(o.outputs[0].token_ids) for (p, lora), o in zip(jobs, outs) if p == PROMPTS[0] * 2}
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


def test_batched_delta_three_ways_agree():
    g = torch.Generator().manual_seed(0)
    x, A, B = torch.randn(7, 5, generator=g), torch.randn(3, 2, 5, generator=g), torch.randn(3, 4, 2, generator=g)
    scale, slots = torch.tensor([0.5, 2.0, 1.0]), torch.tensor([0, -1, 2, 0, 1, -1, 2])
    want = torch.stack([torch.zeros(4) if s < 0 else scale[s] * B[s] @ (A[s] @ x[i]) for i, s in enumerate(slots)])
    torch.testing.assert_close(grouped_delta(x, A, B, scale, slots), want)
    torch.testing.assert_close(gathered_delta(x, A, B, scale, slots), want)
    y = torch.randn(7, 4, generator=g)
    packed_delta(x, y2 := y.clone(), A.transpose(1, 2).contiguous(), [B.transpose(1, 2).contiguous()], scale,
                 StepLayout.build(slots.tolist(), "cpu"))
    torch.testing.assert_close(y2, y + want)


def test_packed_delta_sub_projections_and_lone_slots():
    """Three sub-projections stacked (q/k/v), slot 1 with more than LONG_SLOT rows (runs alone),
    slot 2 unused between used ones, base rows: each row's delta lands in its own sub's columns."""
    g = torch.Generator().manual_seed(1)
    S, r, n_in, outs = 5, 3, 6, [4, 2, 2]
    A_cat, scale = torch.randn(S, 3 * r, n_in, generator=g), torch.rand(S, generator=g)
    Bs = [torch.randn(S, o, r, generator=g) for o in outs]
    slots = [0, -1, 3, 0, 3, -1] + [1] * (LONG_SLOT + 3) + [3]
    x, y = torch.randn(len(slots), n_in, generator=g), torch.randn(len(slots), sum(outs), generator=g)
    want = y.clone()
    for i, s in enumerate(slots):
        if s >= 0:
            want[i] += torch.cat([scale[s] * Bs[k][s] @ (A_cat[s, k * r:(k + 1) * r] @ x[i]) for k in range(3)])
    layout = StepLayout.build(slots, "cpu")
    assert [s for s, _ in layout.long] == [1] and (layout.lo, layout.hi) == (0, 4) and not layout.dense
    packed_delta(x, y, A_cat.transpose(1, 2).contiguous(), [b.transpose(1, 2).contiguous() for b in Bs], scale, layout)
    torch.testing.assert_close(y, want)


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
    """Each refusal a ValueError naming the field and the flags; quantization is not refused."""
    model, tok = tiny
    cases = [(dict(tensor_parallel_size=2), "tensor_parallel_size", "--tensor-parallel-size"),
             (dict(compile=True), "compile", "--compile"),
             (dict(speculative_config={"method": "self_draft", "num_speculative_tokens": 2}), "speculative_config",
              "'self_draft' (--speculative-config)"),
             (dict(speculative_config={"method": "draft_model", "model": "tiny-llama", "num_speculative_tokens": 2}),
              "speculative_config", "'draft_model' (--speculative-config)")]
    for options, field, flag in cases:
        with pytest.raises(ValueError, match=r"enable_lora=True \(--enable-lora\) with .*" + re.escape(flag)) as e:
            LLM(model, tokenizer=tok, enable_lora=True, num_kv_blocks=64, **options)
        assert e.value.param == field


def test_serve_refuses_an_unsupported_combination_at_startup():
    r = subprocess.run([sys.executable, "-m", "minillm", "serve", "--model", "tiny-llama", "--port", "0",
                        "--enable-lora", "--compile"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "error: enable_lora=True (--enable-lora) with compile=True (--compile) is not supported" in r.stderr
    assert "Traceback" not in r.stderr


def add_float_delta(engine_model, adapter):
    """Forward hooks on a no-LoRA engine's (quantized) linears adding one adapter's float delta,
    s * (x A^T) B^T, into each sub-projection's columns: the reference for quantized base + adapter."""
    cfg = engine_model.config
    q, kv, inter = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    columns = {"qkv_proj": [("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)],
               "o_proj": [("o_proj", 0, cfg.hidden_size)],
               "gate_up_proj": [("gate_proj", 0, inter), ("up_proj", inter, inter)],
               "down_proj": [("down_proj", 0, cfg.hidden_size)]}

    def hook(i, parts):
        def add(module, inputs, out):
            out = out.clone()
            for name, start, n in parts:
                if (i, name) in adapter.weights:
                    a, b = adapter.weights[(i, name)]
                    out[..., start:start + n] += adapter.scaling * ((inputs[0] @ a.t()) @ b.t())
            return out
        return add
    return [getattr(layer, attr).register_forward_hook(hook(i, parts))
            for i, layer in enumerate(engine_model.model.layers) for attr, parts in columns.items()]


@pytest.mark.parametrize("scheme,delta", [("int8", "grouped"), ("w4a8", "packed")])
def test_quantized_base_with_float_adapters(tiny, adapters, scheme, delta):
    """Quantized base weights, float adapters: in one batch mixing the base and two adapters, base
    rows get the quantized engine's own no-LoRA tokens, adapter rows the tokens of that engine with
    the adapter's float delta hooked onto its quantized linears (each adapter alone)."""
    model, tok = tiny
    loras = lora_requests(adapters)
    jobs = [(p, lora) for p in PROMPTS for lora in (None, loras["qv"], loras["all"])]
    opts = dict(quantization=scheme, num_kv_blocks=256, max_num_batched_tokens=32)    # <= 64 rows: one int8 kernel
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=2, max_lora_rank=8, **opts)
    llm.llm_engine.lora.use_delta(delta)
    assert type(llm.llm_engine.model.model.layers[0].qkv_proj.base).__name__ != "Linear"
    ours = [list(o.outputs[0].token_ids) for o in run(llm, jobs)]
    plain = LLM(model, tokenizer=tok, **opts)
    engine_model = plain.llm_engine.model
    for lora in (None, loras["qv"], loras["all"]):
        mine = [i for i, (_, lo) in enumerate(jobs) if lo == lora]
        handles = [] if lora is None else add_float_delta(
            engine_model, load_adapter(lora.lora_path, model.config.num_hidden_layers, llm.llm_engine.lora.shapes, 8))
        want = [list(o.outputs[0].token_ids) for o in run(plain, [(jobs[i][0], None) for i in mine])]
        for h in handles:
            h.remove()
        assert [ours[i] for i in mine] == want, f"{scheme} {lora and lora.lora_name}"
    assert len({tuple(t) for t, (p, _) in zip(ours, jobs) if p == PROMPTS[0]}) == 3, "the adapters change the answer"
    float_peft = [reference_tokens(adapters[lo.lora_name][1], p) for p, lo in jobs if lo is not None]
    quant_lora = [t for t, (_, lo) in zip(ours, jobs) if lo is not None]
    if scheme == "w4a8":
        assert quant_lora != float_peft, "the reference must see the quantized base (else it could not tell)"


@pytest.mark.slow
def test_smollm2_mixed_batch_matches_peft(smol, tmp_path):
    """The embedded SmolLM2-135M with two adapters (attention only, rank 8; every linear, rank 4,
    rsLoRA) and the base in one batch: each request's greedy tokens are transformers + peft's."""
    model, tok, _ = smol
    specs = [("attn", ["q_proj", "k_proj", "v_proj", "o_proj"], 8, 16, False),
             ("every", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 4, 8, True)]
    loras = {}
    for i, (name, targets, r, alpha, rslora) in enumerate(specs):
        # std 0.1, not 0.5: at 0.5 every adapted linear's delta is ~50x its base output, 30 layers
        # deep, and float rounding alone (the order of a sum) moves a logit by 0.5
        synthetic.make_adapter(transformers_twin(model), tmp_path / name, targets, r, alpha, 10 + i, rslora, std=0.1)
        loras[name] = LoRARequest(name, i + 1, str(tmp_path / name))
    prompts = [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):")]
    jobs = [(p, lora) for p in prompts for lora in [None, *loras.values()]]
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=64)
    outs = run(llm, jobs)
    llm.llm_engine.lora.use_delta("packed")              # the other way of adding the deltas, same answers
    packed = run(llm, jobs)
    hf = peft.PeftModel.from_pretrained(transformers_twin(model), tmp_path / "attn", adapter_name="attn").eval()
    hf.load_adapter(tmp_path / "every", adapter_name="every")
    for (prompt, lora), out, out_packed in zip(jobs, outs, packed):
        if lora is None:
            with hf.disable_adapter():
                want = reference_tokens(hf, prompt)
        else:
            hf.set_adapter(lora.lora_name)
            want = reference_tokens(hf, prompt)
        compare_greedy(hf, prompt, list(out.outputs[0].token_ids), want)
        compare_greedy(hf, prompt, list(out_packed.outputs[0].token_ids), want)
    assert len({tuple(o.outputs[0].token_ids) for o in outs[:3]}) == 3, "the adapters change the answer"


def test_structured_outputs_follow_each_rows_adapter(tiny, adapters):
    """A JSON-ish regex per request in a batch mixing the base model and every adapter: each answer
    matches the pattern and is the one a model with that adapter merged into its weights gives
    under the same constraint (the mask applies to each row's own adapted logits)."""
    from minillm.bench.lora import shapes
    from minillm.lora.merge import merged_copy
    model, tok = tiny
    loras = lora_requests(adapters)
    pattern = r'\{"answer": "[a-z]{1,6}"\}'
    params = SamplingParams(temperature=0.0, max_tokens=24, structured_outputs={"regex": pattern})
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=256)
    order = [None, *loras.values()]
    outs = llm.generate(prompts * len(order), params, use_tqdm=False,       # one batch: every row its own
                        lora_request=[lora for lora in order for _ in prompts])
    texts = {None if lora is None else lora.lora_name: [o.outputs[0].text for o in outs[k * len(prompts):][:len(prompts)]]
             for k, lora in enumerate(order)}
    for name, got in texts.items():
        for text in got:
            assert re.fullmatch(pattern, text), f"{name}: {text!r} does not match {pattern}"
        alone = model if name is None else merged_copy(model, load_adapter(
            adapters[name][0], model.config.num_hidden_layers, shapes(model.config), 8))
        want = [o.outputs[0].text for o in LLM(alone, tokenizer=tok, num_kv_blocks=256).generate(
            prompts, params, use_tqdm=False)]
        assert got == want, f"{name}: under the constraint the LoRA engine said {got}, the merged model {want}"
    assert len({tuple(v) for v in texts.values()}) > 1, "the adapters were meant to change some answer"
