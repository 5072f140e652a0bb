"""Our forward against transformers: same weights, same logits, same greedy tokens."""
import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from minillm.attention import NoCache
from minillm.config import ModelConfig
from minillm.baselines.static_batching import generate_with_cache
from minillm.models import load_model
from minillm.models.llama import LlamaForCausalLM
from minillm.models.reference import compare_greedy, reference_greedy, transformers_twin
from minillm.models.tiny import TINY_CONFIGS, build_tiny
from minillm.sampling_params import SamplingParams

from conftest import PROMPTS


def our_logits(model, ids):
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), NoCache([len(ids)]))
        return model.compute_logits(hidden)


def max_relative_error(ours, ref):
    return float((ours - ref).abs().max() / ref.abs().max())


def check_logits(model, hf, ids):
    ours = our_logits(model, ids)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape
    err = max_relative_error(ours, ref)
    assert err <= 1e-4, f"max relative logit error {err:.2e} > 1e-4"


def test_tiny_logits_match_transformers(tiny):
    model, tokenizer, hf = tiny
    check_logits(model, hf, tokenizer.encode(PROMPTS[0] + " " + PROMPTS[2]))


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smol):
    model, tokenizer, hf = smol
    check_logits(model, hf, tokenizer.encode(PROMPTS[1]))


def test_rope_far_positions_match_transformers(tiny):
    model, _, hf = tiny
    ids = torch.randint(0, 49152, (1200,), generator=torch.Generator().manual_seed(1)).tolist()
    check_logits(model, hf, ids)   # positions up to 1199


@pytest.mark.slow
def test_smollm2_rope_far_positions(smol):
    model, tokenizer, hf = smol
    text = " ".join(PROMPTS) * 40
    ids = tokenizer.encode(text)[:1100]
    check_logits(model, hf, ids)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
    {"rope_type": "linear", "factor": 4.0},
])
def test_rope_scaling_matches_transformers(scaling):
    cfg = dataclasses.replace(TINY_CONFIGS["tiny-llama"], rope_scaling=scaling, head_dim=32,
                              num_attention_heads=2, num_key_value_heads=1)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(build_tiny("tiny-llama").state_dict(), strict=False)  # norms & embeds
    torch.manual_seed(0)
    for p in model.model.layers.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=p.shape[1] ** -0.5)
    hf = transformers_twin(model)
    ids = torch.randint(0, 49152, (1100,), generator=torch.Generator().manual_seed(2)).tolist()
    check_logits(model.eval(), hf, ids)


def test_tiny_greedy_matches_transformers_for_32_steps(tiny):
    model, tokenizer, hf = tiny
    for prompt in PROMPTS[:2]:
        ids = tokenizer.encode(prompt)
        ours = generate_with_cache(model, None, ids, SamplingParams(temperature=0, max_tokens=40,
                                                                    ignore_eos=True)).token_ids
        compare_greedy(hf, ids, ours, reference_greedy(hf, ids, 40))


@pytest.mark.slow
def test_smollm2_greedy_matches_transformers_for_32_steps(smol):
    model, tokenizer, hf = smol
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}])
    ours = generate_with_cache(model, None, ids, SamplingParams(temperature=0, max_tokens=40,
                                                                ignore_eos=True)).token_ids
    assert compare_greedy(hf, ids, ours, reference_greedy(hf, ids, 40)) == "identical"


def save_checkpoint(model, folder, tie_in_file=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
    state = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings and not tie_in_file:
        state.pop("lm_head.weight")
    save_file(state, str(folder / "model.safetensors"))


def test_load_local_folder_roundtrip(tmp_path, tiny):
    model, tokenizer, hf = tiny
    folder = tmp_path / "ckpt"
    save_checkpoint(model, folder)
    tokenizer.hf.save_pretrained(folder)
    loaded, loaded_tok = load_model(str(folder), device="cpu")
    ids = tokenizer.encode(PROMPTS[0])
    assert torch.equal(our_logits(loaded, ids), our_logits(model, ids))
    assert loaded_tok.encode(PROMPTS[0]) == ids
    # transformers reads the same folder as the same model: our config.json is a real one
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    check_logits(loaded, ref, ids)


def test_sharded_checkpoint_loads(tmp_path):
    model = build_tiny("tiny-llama")
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
    state = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(folder / fname))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    from minillm.models.loader import load_checkpoint
    loaded = load_checkpoint(folder)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_loader_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        load_model("no-such-model")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json is missing"):
        load_model(str(empty))
    (empty / "config.json").write_text(json.dumps(TINY_CONFIGS["tiny-llama"].to_hf_dict()))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model(str(empty))
    model = build_tiny("tiny-llama")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "layers.1.mlp" not in k}
    save_file(state, str(empty / "model.safetensors"))
    with pytest.raises(ValueError, match="missing .*layers.1.mlp"):
        load_model(str(empty))
    bad = dict(TINY_CONFIGS["tiny-llama"].to_hf_dict(), model_type="gpt2")
    (empty / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_model(str(empty))
    (empty / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(ValueError, match="missing required key.*vocab_size"):
        load_model(str(empty))


def test_config_reads_v4_and_v5_rope_spellings():
    base = TINY_CONFIGS["tiny-llama"].to_hf_dict()
    v4 = dict(base, rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    v5 = {k: v for k, v in base.items() if k != "rope_theta"}
    v5["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "linear", "factor": 2.0}
    for d in (v4, v5):
        cfg = ModelConfig.from_hf_dict(d)
        assert cfg.rope_theta == 5e5 and cfg.rope_scaling["rope_type"] == "linear"
    plain = ModelConfig.from_hf_dict(dict(v5, rope_parameters={"rope_theta": 1e4, "rope_type": "default"}))
    assert plain.rope_scaling is None and plain.rope_theta == 1e4


def test_converted_checkpoint_names_its_architecture(tmp_path):
    """transformers serve (the serving benchmark's peer) refuses "architectures": null."""
    import json

    from minillm.models.embedded import name_architecture
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "architectures": None}))
    name_architecture(config)
    assert json.loads(config.read_text())["architectures"] == ["LlamaForCausalLM"]
