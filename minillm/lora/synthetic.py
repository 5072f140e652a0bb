"""Adapters made in-process with peft: many fine-tunes without training any (bench lora, lesson 13).

peft starts B at zero (a fresh adapter changes nothing); these fill A and B with seeded
random values, so each adapter changes the answer the way a trained one would, at its rank
and on its target modules, and is saved in peft's own format (what every fine-tuning tool writes).
"""
from __future__ import annotations

from pathlib import Path

import torch

# target-module sets the adapters cycle through (several per run, as fine-tunes differ)
TARGET_SETS = (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
               ["q_proj", "v_proj"],
               ["q_proj", "k_proj", "v_proj", "o_proj"],
               ["gate_proj", "up_proj", "down_proj"])


def make_adapter(hf_base, folder, targets, r: int, alpha: float, seed: int, rslora: bool = False,
                 std: float = 0.5) -> None:
    """A peft LoRA adapter on the transformers model `hf_base`, A and B ~ N(0, std^2), saved to `folder`."""
    try:
        import peft
    except ImportError as e:
        raise ValueError("making adapters needs peft: pip install peft") from e
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora,
                             lora_dropout=0.0)
    model = peft.get_peft_model(hf_base, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    model.save_pretrained(str(folder))
    model.unload()                          # the base back without LoRA layers for the next adapter


def make_adapters(model, root, count: int, seed: int = 0, ranks=(8, 16), std: float = 0.5) -> list[dict]:
    """`count` adapters for the minillm `model` under `root`: ranks and target sets in turn,
    alpha = 2r. Returns [{"name", "path", "rank", "targets"}]."""
    from ..models.reference import transformers_twin
    hf = transformers_twin(model)
    made = []
    for i in range(count):
        r, targets = ranks[i % len(ranks)], TARGET_SETS[i % len(TARGET_SETS)]
        path = Path(root) / f"adapter{i:02d}"
        make_adapter(hf, path, targets, r, 2 * r, seed * 1000 + i, std=std)
        made.append({"name": path.name, "path": str(path), "rank": r, "targets": targets})
    return made
