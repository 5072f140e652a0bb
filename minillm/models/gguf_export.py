"""A minillm model written as a GGUF file, so that llama.cpp runs the very same weights.

    write_gguf(model, "m.gguf", "Q4_1")          # F32, F16, Q8_0 or Q4_1
    dummy_gguf("llama-3.2-1b", seed=0, qtype="Q4_1")   # the dummy model's GGUF, cached

The `gguf` package (llama.cpp's own Python writer) does the file format and the quantization
(`gguf.quants.quantize`: numpy, Q8_0 and Q4_1 among its types). What we add is the mapping:
  names        model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight, ... (TENSORS below)
  RoPE layout  llama.cpp's "llama" architecture rotates adjacent pairs (x0, x1), transformers and
               minillm rotate halves (x_i, x_{i+D/2}); llama.cpp's converter permutes the rows of
               q and k so that both compute the same thing, and so do we (`permute_rows`). Qwen2/3
               rotate halves in llama.cpp too: no permutation.
  llama3 RoPE  its frequency factors as the `rope_freqs.weight` tensor (what the converter writes).
  tokenizer    SmolLM2's, from the embedded model's tokenizer.json (extended with `<extra_N>` up
               to the vocabulary, dummy.py), so llama.cpp cuts text into the same tokens as minillm.
  types        norms, biases and rope_freqs stay F32; with Q4_1 the embedding and a separate output
               head are Q8_0, as in the embedded model's own GGUF. A tensor whose rows are not a
               multiple of 32 (the quant block) falls back to F16.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import torch

from ..utils.paths import cache_dir
from .dummy import BOS_ID, EOS_ID, dummy_config, dummy_hf_config, dummy_parameters, init_std, tokenizer_json

GGUF_TYPES = ("F32", "F16", "Q8_0", "Q4_1")
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
TENSORS = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
           "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
           "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
           "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
           "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
           "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
           "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def gguf_name(name: str) -> str:
    if name in TOP:
        return TOP[name]
    parts = name.split(".")                       # model.layers.<i>.<rest>
    if parts[:2] != ["model", "layers"] or ".".join(parts[3:]) not in TENSORS:
        raise ValueError(f"no GGUF name for tensor {name!r}")
    return f"blk.{parts[2]}.{TENSORS['.'.join(parts[3:])]}"


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Halves -> adjacent pairs within each head (llama.cpp convert_hf_to_gguf's `permute`)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_type(name: str, array: np.ndarray, qtype: str) -> str:
    if array.ndim == 1 or qtype == "F32":
        return "F32"
    if qtype == "F16" or array.shape[-1] % 32:
        return "F16"
    if qtype == "Q4_1" and name in ("token_embd.weight", "output.weight"):
        return "Q8_0"
    return qtype


def llama3_rope_factors(config) -> np.ndarray:
    """Per frequency, what llama3 scaling divides it by (convert_hf_to_gguf's rope_freqs)."""
    s, d = config.rope_scaling, config.head_dim
    factor, low, high = s.get("factor", 8.0), s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old = s.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * config.rope_theta ** (i / d)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def add_metadata(w, config, arch: str, qtype: str) -> None:
    import gguf
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)
    w.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                     "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[qtype])
    kind = (config.rope_scaling or {}).get("rope_type")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(config.rope_scaling["factor"])
    elif kind not in (None, "llama3"):
        raise ValueError(f"rope_scaling {kind!r} cannot be written to GGUF here (linear and llama3 can)")


def add_tokenizer(w, vocab_size: int) -> None:
    """SmolLM2's BPE vocabulary, merges and special tokens (dummy.tokenizer_json)."""
    import gguf
    data = tokenizer_json(vocab_size)
    vocab = data["model"]["vocab"]
    if len(vocab) != vocab_size:
        raise ValueError(f"the model's vocabulary ({vocab_size}) is smaller than SmolLM2's tokenizer ({len(vocab)})")
    tokens = [""] * vocab_size
    for text, i in vocab.items():
        tokens[i] = text
    types = [gguf.TokenType.NORMAL] * vocab_size
    for t in data.get("added_tokens", []):
        types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(0)
    w.add_pad_token_id(EOS_ID)
    w.add_add_bos_token(False)


def write_gguf(model, path, qtype: str = "F32", name: str = "minillm") -> Path:
    """Write `model` (a LlamaForCausalLM, its tokenizer SmolLM2's) to `path` as a GGUF whose
    matrices are `qtype`. Written to a temporary file, then renamed: never half a file."""
    return write_tensors(model.config, model.state_dict().items(), path, qtype, name)


def quantize_rows(array: np.ndarray, kind) -> np.ndarray:
    """gguf's quantize, a few million values at a time: its numpy temporaries are several times
    the input, too much for a 1B model's embedding at once. Blocks never span rows: the same bytes."""
    from gguf.quants import quantize
    step = max(1, (1 << 22) // array.shape[-1])
    return np.concatenate([quantize(array[i:i + step], kind) for i in range(0, array.shape[0], step)])


def write_tensors(config, items, path, qtype: str = "F32", name: str = "minillm") -> Path:
    """`write_gguf` from (state-dict name, tensor) pairs, which may be drawn one at a time."""
    import gguf
    if qtype not in GGUF_TYPES:
        raise ValueError(f"GGUF type must be one of {', '.join(GGUF_TYPES)}, got {qtype!r}")
    path = Path(path)
    if config.model_type not in ARCHITECTURES:
        raise ValueError(f"no llama.cpp architecture for model_type {config.model_type!r}")
    arch = ARCHITECTURES[config.model_type]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(name)
    add_metadata(w, config, arch, qtype)
    add_tokenizer(w, config.vocab_size)
    if (config.rope_scaling or {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    for key, tensor in items:
        if key.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and key == "lm_head.weight"):
            continue
        out = gguf_name(key)
        array = tensor.detach().to("cpu", torch.float32).contiguous().numpy()
        if arch == "llama" and ".attn_q." in out:
            array = permute_rows(array, config.num_attention_heads)
        elif arch == "llama" and ".attn_k." in out:
            array = permute_rows(array, config.num_key_value_heads)
        kind = tensor_type(out, array, qtype)
        if kind == "F32":
            w.add_tensor(out, array)
        elif kind == "F16":
            w.add_tensor(out, array.astype(np.float16))
        else:
            ggml = gguf.GGMLQuantizationType[kind]
            w.add_tensor(out, quantize_rows(array, ggml), raw_dtype=ggml)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def dummy_gguf(spec: str, seed: int = 0, qtype: str = "Q4_1") -> Path:
    """The GGUF of `load_model(spec, load_format="dummy", seed=seed)`'s weights, written once into
    the cache (a 1B shape: about a minute) and reused."""
    tag = hashlib.sha256(repr(sorted(dummy_hf_config(spec).items())).encode()).hexdigest()[:10]
    slug = "".join(c if c.isalnum() or c in ".-" else "_" for c in Path(spec).name)
    path = cache_dir() / "gguf" / f"dummy-{slug}-{tag}-seed{seed}-{qtype}.gguf"
    if not path.exists():
        print(f"writing the dummy model's GGUF ({qtype}) for llama.cpp: {path}", flush=True)
        config = dummy_config(spec)
        write_tensors(config, dummy_parameters(config, seed, init_std(spec)), path, qtype,
                      name=f"dummy {spec} seed {seed}")
    return path
