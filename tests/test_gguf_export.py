"""A minillm model written as GGUF (models/gguf_export.py): read back with gguf's own reader,
and, where llama.cpp is at hand, run by llama.cpp to the same greedy tokens as minillm."""
import importlib.util
import os
import shutil

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

from minillm.models.gguf_export import gguf_name, llama3_rope_factors, permute_rows, write_gguf  # noqa: E402
from minillm.models.tiny import build_tiny  # noqa: E402


def read(path):
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    return reader, tensors


def as_float(t) -> np.ndarray:
    """A GGUF tensor as float32 in numpy's [rows, columns] order."""
    shape = tuple(int(n) for n in reversed(t.shape))
    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    return dequantize(t.data, t.tensor_type).reshape(shape)


def expected(model, key: str) -> np.ndarray:
    w = model.state_dict()[key].float().numpy()
    if ".q_proj." in key:
        return permute_rows(w, model.config.num_attention_heads)
    if ".k_proj." in key:
        return permute_rows(w, model.config.num_key_value_heads)
    return w


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("tiny-llama")


def test_f32_round_trips_every_tensor_and_the_metadata(tiny, tmp_path):
    reader, tensors = read(write_gguf(tiny, tmp_path / "tiny.gguf", "F32"))
    keys = [k for k in tiny.state_dict() if k != "lm_head.weight" or not tiny.config.tie_word_embeddings]
    assert set(tensors) == {gguf_name(k) for k in keys}
    for key in keys:
        np.testing.assert_array_equal(as_float(tensors[gguf_name(key)]), expected(tiny, key), err_msg=key)
    field = lambda name: reader.fields[name].contents()                             # noqa: E731
    assert field("general.architecture") == "llama" and field("llama.block_count") == 2
    assert field("llama.attention.head_count_kv") == 2 and field("llama.rope.dimension_count") == 16
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == tiny.config.vocab_size
    assert field("tokenizer.ggml.pre") == "smollm" and field("tokenizer.ggml.eos_token_id") == 2


def test_q8_0_dequantizes_within_its_step_and_q4_1_keeps_the_embedding_at_q8_0(tiny, tmp_path):
    _, tensors = read(write_gguf(tiny, tmp_path / "q8.gguf", "Q8_0"))
    t = tensors["blk.1.ffn_down.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    w = expected(tiny, "model.layers.1.mlp.down_proj.weight")
    step = np.abs(w).reshape(-1, 32).max(axis=1, keepdims=True) / 127       # one int8 step per 32-block
    error = np.abs(as_float(t) - w).reshape(-1, 32)                         # half a step, and the f16 scale's rounding
    assert (error <= step * 0.6).all() and error.max() > 0
    _, tensors = read(write_gguf(tiny, tmp_path / "q4.gguf", "Q4_1"))
    kinds = {name: t.tensor_type.name for name, t in tensors.items()}
    assert kinds["blk.0.attn_q.weight"] == "Q4_1" and kinds["token_embd.weight"] == "Q8_0"
    assert kinds["output.weight"] == "Q8_0" and kinds["blk.0.attn_norm.weight"] == "F32"


def test_qwen_shapes_keep_their_layout_biases_and_norms(tmp_path):
    qwen2 = build_tiny("tiny-qwen2")
    reader, tensors = read(write_gguf(qwen2, tmp_path / "q2.gguf", "F16"))
    assert reader.fields["general.architecture"].contents() == "qwen2"
    np.testing.assert_array_equal(as_float(tensors["blk.0.attn_q.bias"]),
                                  qwen2.state_dict()["model.layers.0.self_attn.q_proj.bias"].numpy())
    q = qwen2.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()    # rotate-half in llama.cpp too
    np.testing.assert_allclose(as_float(tensors["blk.0.attn_q.weight"]), q, atol=2e-3, rtol=1e-3)
    _, tensors = read(write_gguf(build_tiny("tiny-qwen3"), tmp_path / "q3.gguf", "F32"))
    assert "blk.1.attn_k_norm.weight" in tensors and "output.weight" not in tensors          # tied head


def test_llama3_rope_factors_are_minillms_frequencies():
    from minillm.models.dummy import dummy_config
    from minillm.models.llama import rope_inverse_frequencies
    cfg = dummy_config("llama-3.2-1b")
    plain = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    ours = rope_inverse_frequencies(cfg).double()
    np.testing.assert_allclose((plain / torch.from_numpy(llama3_rope_factors(cfg)).double()).numpy(),
                               ours.numpy(), rtol=1e-5)


def test_bad_type_is_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match="GGUF type"):
        write_gguf(tiny, tmp_path / "x.gguf", "Q4_K")


# --- llama.cpp runs the very same model ------------------------------------------------------

PROMPT = "The history of the city goes back many centuries. Its first houses stood"


def llama_server_path():
    path = os.environ.get("MINILLM_LLAMA_SERVER") or shutil.which("llama-server")
    return path if path and os.access(path, os.X_OK) else None


@pytest.fixture(scope="module")
def embedded_f32(tmp_path_factory):
    from minillm.models.embedded import embedded_checkpoint_dir
    from minillm.models.loader import load_checkpoint
    model = load_checkpoint(embedded_checkpoint_dir())
    return model, write_gguf(model, tmp_path_factory.mktemp("gguf") / "smollm2-f32.gguf", "F32")


def minillm_greedy(n: int) -> tuple[list[int], list[int]]:
    from minillm import LLM, SamplingParams
    llm = LLM(device="cpu", dtype="float32")
    prompt = llm.tokenizer.encode(PROMPT)
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                       use_tqdm=False)
    return prompt, list(out[0].outputs[0].token_ids)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None and llama_server_path() is None,
                    reason="neither llama-cpp-python nor llama-server (MINILLM_LLAMA_SERVER or PATH) is here")
def test_llama_cpp_greedy_tokens_on_the_f32_gguf_equal_minillms(embedded_f32):
    _, path = embedded_f32
    prompt, ours = minillm_greedy(16)
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    if llama_cpp is not None:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, seed=0, verbose=False)
        stream = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
        theirs = [next(stream) for _ in range(16)]
    else:
        theirs = llama_server_greedy(path, prompt, 16)
    assert theirs == ours


def llama_server_greedy(path, prompt: list[int], n: int) -> list[int]:
    import httpx
    from minillm.bench.llama_server import llama_server_command
    from minillm.bench.server_process import ServerProcess, free_port
    port = free_port()
    with ServerProcess(llama_server_command(llama_server_path(), path, port, 1, 2), port, ready_timeout=120) as s:
        body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
                "return_tokens": True, "cache_prompt": False}
        reply = httpx.post(f"{s.url}/completion", json=body, timeout=120).json()
    return list(reply["tokens"])


def test_a_dummy_models_gguf_drawn_tensor_by_tensor_is_the_built_models(tmp_path):
    from minillm.models.dummy import build_dummy, dummy_config, dummy_parameters
    from minillm.models.gguf_export import write_tensors
    cfg = dummy_config("smollm2-135m")
    cfg.num_hidden_layers = 1
    whole = write_gguf(build_dummy(cfg, seed=3), tmp_path / "whole.gguf", "Q4_1")
    drawn = write_tensors(cfg, dummy_parameters(cfg, seed=3), tmp_path / "drawn.gguf", "Q4_1")
    assert whole.read_bytes() == drawn.read_bytes()
