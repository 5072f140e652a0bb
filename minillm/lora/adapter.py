"""A LoRA adapter in peft's format: the folder every fine-tuning tool writes.

    adapter_config.json          r, lora_alpha, target_modules, use_rslora, ...
    adapter_model.safetensors    base_model.model.model.layers.{i}.{self_attn|mlp}.{name}.lora_A.weight  [r, in]
                                 ...                                              .lora_B.weight  [out, r]

LoRA leaves a linear's weight W frozen and learns a low-rank update: y = W x + s * B (A x),
with A [r, in], B [out, r] and s = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)). Only plain
LoRA on the decoder's seven linears is served; every other peft feature changes the math
(DoRA rescales W's columns, bias training adds a vector, embedding adapters and
`modules_to_save` replace whole tensors), so a config that uses one is refused by name, never
served approximately.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")
# peft options that change what the adapted layer computes: refused when set to anything but their default
_REFUSED = {"use_dora": "DoRA", "modules_to_save": "modules_to_save (whole tensors trained beside LoRA)",
            "lora_bias": "a trained bias on lora_B", "use_qalora": "QALoRA", "rank_pattern": "per-module ranks",
            "alpha_pattern": "per-module alphas", "trainable_token_indices": "trained embedding rows",
            "layer_replication": "layer replication", "alora_invocation_tokens": "activated LoRA",
            "target_parameters": "LoRA on parameters", "fan_in_fan_out": "fan_in_fan_out (Conv1D weights)",
            "use_bdlora": "BD-LoRA"}


@dataclass
class LoRAAdapter:
    """A loaded adapter in host memory: rank r, scale s, and {(layer, module): (A, B)} in float32."""
    name: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def _bad(path, field: str, message: str):
    e = ValueError(f"LoRA adapter {path}: {field}: {message}")
    e.param = field
    raise e


def read_adapter_config(path: Path) -> dict:
    """adapter_config.json, checked: plain LoRA on this engine's linears, or a ValueError naming the field."""
    if not path.is_dir():
        _bad(path, "lora_path", "no such adapter folder")
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        _bad(path, "adapter_config.json", "missing: peft's save_pretrained writes it beside the weights")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        _bad(path, "adapter_config.json", f"not valid JSON ({e})")
    if not isinstance(cfg, dict):
        _bad(path, "adapter_config.json", "must be a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        _bad(path, "peft_type", f"only LORA adapters are served, got {cfg.get('peft_type')!r}")
    for key, what in _REFUSED.items():
        if cfg.get(key):
            _bad(path, key, f"{what} is not supported (only plain LoRA); got {cfg[key]!r:.80}")
    if cfg.get("bias", "none") != "none":
        _bad(path, "bias", f"trained biases are not supported (only bias='none'), got {cfg['bias']!r}")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        _bad(path, "r", f"must be an integer >= 1, got {r!r:.40}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        _bad(path, "lora_alpha", f"must be a number, got {alpha!r:.40}")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):          # a list names modules; a string is a regex (the weights tell)
        unknown = [t for t in targets if t not in TARGETS]
        if unknown:
            _bad(path, "target_modules", f"{', '.join(map(repr, unknown))}: not a module LoRA can adapt in this "
                                         f"model (it has {', '.join(TARGETS)})")
    elif not isinstance(targets, str):
        _bad(path, "target_modules", f"must be a list of module names or a regex string, got {targets!r:.80}")
    return cfg


def load_adapter(path, num_layers: int, shapes: dict[str, tuple[int, int]], max_rank: int,
                 name: str | None = None) -> LoRAAdapter:
    """Load and check the adapter folder at `path` for a model with `num_layers` layers whose
    linears have `shapes` {module: (out, in)}. A rank above `max_rank` is refused (the slots
    are sized for it)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    path = Path(path)
    cfg = read_adapter_config(path)
    r = cfg["r"]
    if r > max_rank:
        _bad(path, "r", f"rank {r} is above max_lora_rank={max_rank}: raise max_lora_rank to at least {r}")
    file = path / "adapter_model.safetensors"
    if not file.is_file():
        _bad(path, "adapter_model.safetensors", "missing (a .bin adapter: save it again with safe_serialization)")
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        _bad(path, "adapter_model.safetensors", f"unreadable ({e})")
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in TARGETS:
            _bad(path, "adapter_model.safetensors", f"tensor {key!r} is not LoRA on a decoder linear "
                                                    f"({', '.join(TARGETS)}); embedding and lm_head adapters are not supported")
        layer, module, half = int(m.group(1)), m.group(2), m.group(3)
        if layer >= num_layers:
            _bad(path, "adapter_model.safetensors", f"tensor {key!r} is for layer {layer}; the model has {num_layers}")
        halves.setdefault((layer, module), {})[half] = t.float()
    if not halves:
        _bad(path, "adapter_model.safetensors", "holds no LoRA weights")
    weights = {}
    for (layer, module), ab in sorted(halves.items()):
        out, inp = shapes[module]
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            _bad(path, "adapter_model.safetensors", f"layer {layer} {module}: lora_{'A' if a is None else 'B'} missing")
        if tuple(a.shape) != (r, inp) or tuple(b.shape) != (out, r):
            _bad(path, "adapter_model.safetensors",
                 f"layer {layer} {module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit "
                 f"r={r} and the model's [{out}, {inp}] weight (expected A ({r}, {inp}), B ({out}, {r}))")
        weights[(layer, module)] = (a.contiguous(), b.contiguous())
    scaling = cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)
    return LoRAAdapter(name or path.name, r, float(scaling), weights)
