"""What the LoRA tests (test_lora.py, test_server_lora.py, test_front_lora.py) share: adapters made in-process with peft."""
import torch


def make_adapter(hf_base, folder, targets, r, alpha, rslora, seed):
    """A peft LoRA adapter on `hf_base` with seeded random non-zero B (peft starts B at zero), saved."""
    import peft
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, lora_dropout=0.0)
    model = peft.get_peft_model(hf_base, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(folder)
    model.unload()                          # the base back without LoRA layers for the next adapter


def make_adapters(model, root, adapters, seed_offset=10):
    """Every (name, targets, r, alpha, rslora) of `adapters` made on minillm `model`'s transformers
    twin and saved under `root`: {name: folder}."""
    from minillm.models.reference import transformers_twin
    folders = {}
    for seed, (name, targets, r, alpha, rslora) in enumerate(adapters):
        make_adapter(transformers_twin(model), root / name, targets, r, alpha, rslora, seed + seed_offset)
        folders[name] = str(root / name)
    return folders
