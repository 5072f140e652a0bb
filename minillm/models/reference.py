"""The transformers twin of one of our models, with the same weights: the reference
that tests and lesson 00 compare against. Never used by the engine."""
from __future__ import annotations

import torch

from .llama import LlamaForCausalLM


def transformers_twin(model: LlamaForCausalLM):
    """A transformers causal LM holding exactly our model's weights (float32, CPU, eval)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = model.config.to_hf_dict()
    hf_config = AutoConfig.for_model(d.pop("model_type"), **d)
    hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight") or not model.config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto transformers: missing {missing}, unexpected {unexpected}")
    return hf.eval()


@torch.inference_mode()
def reference_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate`, EOS ignored, exactly max_new_tokens tokens."""
    ids = torch.tensor([prompt_ids])
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                            do_sample=False, eos_token_id=None, pad_token_id=0,
                            temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt_ids):].tolist()


TIE_TOLERANCE = 1e-3


@torch.inference_mode()
def compare_greedy(hf_model, prompt_ids: list[int], ours: list[int], reference: list[int]) -> str:
    """'identical', or 'tie at step i' when the first difference is a float rounding tie:
    at that step the reference's logits of both tokens lie within 1e-3 of its largest
    logit. Anything else raises AssertionError saying where and by how much."""
    if ours == reference:
        return "identical"
    n = min(len(ours), len(reference))
    i = next((j for j in range(n) if ours[j] != reference[j]), n)
    if i == n:
        raise AssertionError(f"lengths differ: ours {len(ours)} tokens, reference {len(reference)}")
    logits = hf_model(torch.tensor([prompt_ids + reference[:i]])).logits[0, -1].float()
    top = logits.max()
    gap_ours, gap_ref = float(top - logits[ours[i]]), float(top - logits[reference[i]])
    if max(gap_ours, gap_ref) > TIE_TOLERANCE:
        raise AssertionError(f"greedy tokens differ at step {i}: ours {ours[i]} (logit {gap_ours:.4g} below "
                             f"the max), reference {reference[i]} ({gap_ref:.4g} below): not a rounding tie")
    return f"tie at step {i}"
