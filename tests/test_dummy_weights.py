"""Dummy weights (load_format="dummy"): any shape, seeded, marked, with SmolLM2's tokenizer."""
import json

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.bench.model_args import label, resolve_model_args
from minillm.cli.engine_args import add_engine_arguments
from minillm.config import EngineConfig, ModelConfig
from minillm.models import load_model, load_tokenizer
from minillm.models.dummy import DUMMY_MARK, build_dummy, dummy_config, dummy_tokenizer
from minillm.models.embedded import embedded_checkpoint_dir
from minillm.models.shapes import SHAPES

TINY = dict(model_type="llama", vocab_size=49152 + 64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.02)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("shape") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_every_preset_is_a_valid_shape_and_135m_is_the_embedded_models():
    for name in SHAPES:
        cfg = dummy_config(name)
        assert cfg.vocab_size >= 49152 and cfg.tie_word_embeddings
    ours = dummy_config("smollm2-135m")
    real = ModelConfig.from_hf_dict(json.loads((embedded_checkpoint_dir() / "config.json").read_text()))
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                "max_position_embeddings", "tie_word_embeddings", "model_type"):
        mine, theirs = getattr(ours, key), getattr(real, key)
        assert mine == (pytest.approx(theirs, rel=1e-6) if isinstance(theirs, float) else theirs), key
    llama = dummy_config("llama-3.2-1b")
    assert (llama.vocab_size, llama.num_hidden_layers, llama.rope_scaling["rope_type"]) == (128256, 16, "llama3")


def test_weights_are_seeded_scaled_and_tied():
    cfg = dummy_config("smollm2-135m")
    cfg.num_hidden_layers = 2                               # the same shape, fewer layers: a fast test
    a, b, c = build_dummy(cfg, seed=0), build_dummy(cfg, seed=0), build_dummy(cfg, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])
    assert a.lm_head.weight is a.model.embed_tokens.weight
    assert sa["model.layers.1.self_attn.q_proj.weight"].std().item() == pytest.approx(0.02, rel=0.02)
    assert torch.equal(sa["model.norm.weight"], torch.ones(cfg.hidden_size))


def test_a_config_json_runs_end_to_end_marked_with_finite_spread_logits(tiny_config):
    from minillm.models.reference import transformers_twin
    model, tokenizer = load_model(tiny_config, device="cpu", load_format="dummy")
    assert model.dummy_weights.startswith(tiny_config) and model.config.vocab_size == TINY["vocab_size"]
    hf = transformers_twin(model)
    with torch.no_grad():
        logits = hf(torch.tensor([tokenizer.encode("The quick brown fox")])).logits[0, -1]
    assert torch.isfinite(logits).all() and 0.05 < logits.std().item() < 5        # neither flat nor exploding
    llm = LLM(tiny_config, load_format="dummy", device="cpu")
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 6


def test_tokenizer_is_smollm2s_extended_to_the_vocabulary():
    ours, embedded = dummy_tokenizer(49152 + 64), load_tokenizer()
    text = "Dummy weights, real tokens: héllo 123"
    assert ours.encode(text) == embedded.encode(text)
    assert ours.decode([49152 + 7]) == f"<extra_{49152 + 7}>"
    assert ours.eos_token_ids == {2}


def test_bad_input_is_refused_clearly(tiny_config, tmp_path):
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(load_format="random")
    with pytest.raises(ValueError, match="needs a model shape"):
        load_model("llama-9b", load_format="dummy")
    small = tmp_path / "config.json"
    small.write_text(json.dumps(dict(TINY, vocab_size=1000)))
    with pytest.raises(ValueError, match="at least"):
        load_model(str(small), load_format="dummy")
    with pytest.raises(ValueError, match="load_format must be"):
        load_model("tiny-llama", load_format="npz")


def test_bench_flags_become_model_and_load_format(tiny_config):
    import argparse
    from minillm.bench.model_args import add_model_arguments
    p = argparse.ArgumentParser()
    add_model_arguments(p)
    add_engine_arguments(p)
    args = resolve_model_args(p.parse_args(["--model-shape", "llama-3.2-1b"]))
    assert (args.model, args.load_format) == ("llama-3.2-1b", "dummy") and DUMMY_MARK in label(args)
    args = resolve_model_args(p.parse_args(["--hf-config", tiny_config]))
    assert (args.model, args.load_format) == (tiny_config, "dummy")
    assert label(resolve_model_args(p.parse_args([]))) == "SmolLM2-135M-Instruct"
    with pytest.raises(ValueError, match="one of"):
        resolve_model_args(p.parse_args(["--model", "x", "--model-shape", "smollm2-135m"]))
