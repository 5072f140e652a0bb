"""The transformers twin of one of our models, with the same weights: the reference
that tests and lesson 00 compare against. Never used by the engine."""
from __future__ import annotations

import torch

from .llama import LlamaForCausalLM


def transformers_twin(model: LlamaForCausalLM, dtype=torch.float32, device="cpu"):
    """A transformers causal LM holding exactly our model's weights (eval; float32 on CPU
    unless told: a GPU check builds it in the engine's dtype on the same GPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = model.config.to_hf_dict()
    hf_config = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device(device):               # built where it runs: a 0.6B model inits in seconds on a GPU
        hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight") or not model.config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto transformers: missing {missing}, unexpected {unexpected}")
    return hf.to(device=device, dtype=dtype).eval()


@torch.inference_mode()
def reference_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate`, EOS ignored, exactly max_new_tokens tokens."""
    ids = torch.tensor([prompt_ids], device=hf_model.device)
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                            do_sample=False, eos_token_id=None, pad_token_id=0,
                            temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt_ids):].tolist()


TIE_TOLERANCE = 1e-3          # float32: absolute, in logits (DESIGN.md's contract)
# Half precision: a tie is both gaps within HALF_TIE_ROUNDINGS units of roundoff of the largest
# logit, i.e. the two logits agree in all but the last 4 significant bits. Why 16: each logit is
# rounded once at the output (<= u|l| each, so the gap can move by 2u|l|), and the residual stream
# is rounded at every layer's two adds; two implementations that order their sums differently
# drift apart like a random walk, ~sqrt(2 L) u after L layers, seen through a dot product that can
# double it: 2 + 2 sqrt(2 L) ~ 16 roundings for L = 28-30 (Qwen3-0.6B, SmolLM2).
HALF_TIE_ROUNDINGS = 16
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}   # 8 and 11 significant bits


def tie_tolerance(dtype: torch.dtype, max_logit: float) -> float:
    """How far below the largest logit two tokens may lie and still be a rounding tie, for
    logits computed in `dtype`: 1e-3 in float32; HALF_TIE_ROUNDINGS * u * |max logit| in
    bfloat16 (u = 2^-8: 1/16 of the max) and float16 (u = 2^-11: 1/128 of the max)."""
    if dtype not in UNIT_ROUNDOFF:
        return TIE_TOLERANCE
    return max(TIE_TOLERANCE, HALF_TIE_ROUNDINGS * UNIT_ROUNDOFF[dtype] * abs(max_logit))


@torch.inference_mode()
def compare_greedy(hf_model, prompt_ids: list[int], ours: list[int], reference: list[int]) -> str:
    """'identical', or 'tie at step i' when the first difference is a rounding tie: at that
    step the reference's logits of both tokens lie within `tie_tolerance(its dtype, its largest
    logit)` of its largest logit (1e-3 in float32). Anything else raises AssertionError
    saying where and by how much."""
    if ours == reference:
        return "identical"
    n = min(len(ours), len(reference))
    i = next((j for j in range(n) if ours[j] != reference[j]), n)
    if i == n:
        raise AssertionError(f"lengths differ: ours {len(ours)} tokens, reference {len(reference)}")
    ids = torch.tensor([prompt_ids + reference[:i]], device=hf_model.device)
    logits = hf_model(ids).logits[0, -1].float()
    top = logits.max()
    gap_ours, gap_ref = float(top - logits[ours[i]]), float(top - logits[reference[i]])
    tolerance = tie_tolerance(hf_model.dtype, float(top))
    if max(gap_ours, gap_ref) > tolerance:
        raise AssertionError(f"greedy tokens differ at step {i}: ours {ours[i]} (logit {gap_ours:.4g} below "
                             f"the max), reference {reference[i]} ({gap_ref:.4g} below): not a rounding tie "
                             f"(tolerance {tolerance:.3g} in {hf_model.dtype})")
    return f"tie at step {i}"
