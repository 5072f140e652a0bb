"""The same engine on CUDA (skipped where there is none): greedy tokens equal the CPU's
(tie-aware), swap moves blocks between GPU and pinned CPU memory."""
import pytest
import torch

from minillm.engine import LLMEngine
from minillm.models import load_model
from minillm.models.reference import compare_greedy, reference_greedy, transformers_twin
from minillm.sampling import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_engine_on_cuda_matches_transformers(mode):
    model, tokenizer = load_model("SmolLM2-135M-Instruct", device="cuda")
    hf = transformers_twin(model.cpu()).eval()
    model.cuda()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}])
               for q in ("What is the capital of France?", "Name three fruits.", "Count to five.")]
    engine = LLMEngine(model, tokenizer, block_size=16, num_kv_blocks=12, max_model_len=190,
                       preemption_mode=mode)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for ids, out in zip(prompts, outs):
        compare_greedy(hf, ids, out.outputs[0].token_ids, reference_greedy(hf, ids, 48))
    assert engine.stats()["num_preemptions"] > 0
    assert engine.stats()["kv_blocks_used"] == 0
