"""One pipeline stage: its slice of the decoder layers, its own KV pool, its step.

A stage's model is an ordinary LlamaForCausalLM whose config says it has only this stage's
layers (renumbered 0..k-1, so the KV pool, PagedKVCache.for_model, holds exactly those layers'
K/V), plus the embedding, the final norm and the head (used by the first and last stages; kept
on every stage for simplicity: a middle stage holds them unused). It goes through the same
model_for_engine as a one-process engine (fused layers, CPU panels), and with T > 1 through
shard_model first (tensor parallelism inside the stage), so its arithmetic is the same.

A step: the first stage embeds the plan's tokens, the others receive the previous stage's hidden
states; every stage runs its layers over its own pool; a middle stage sends its hidden states on,
the last one normalises and scores the rows that sample, and its TP rank 0 sends those logits
to the driver.
"""
from __future__ import annotations

import dataclasses

import torch

from ..attention import make_backend
from ..attention.paged import PagedStep
from ..config import ModelConfig
from ..kv.paged_cache import PagedKVCache
from ..models.llama import LlamaForCausalLM, RotaryEmbedding
from ..runner.engine_model import model_for_engine
from .sharding import shard_model

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def stage_tensor_names(state_dict_keys, layers: range) -> list[str]:
    """The weights a stage needs: its layers' and everything that is not a layer's."""
    def wanted(name: str) -> bool:
        if not name.startswith("model.layers."):
            return True
        return int(name.split(".")[2]) in layers
    return [k for k in state_dict_keys if wanted(k)]


def local_name(name: str, first_layer: int) -> str:
    """model.layers.12.x -> model.layers.(12 - first_layer).x (the stage's own numbering)."""
    if not name.startswith("model.layers."):
        return name
    parts = name.split(".")
    parts[2] = str(int(parts[2]) - first_layer)
    return ".".join(parts)


def build_stage_model(model_config: dict, layers: range, tensors: dict[str, torch.Tensor]):
    cfg = dataclasses.replace(ModelConfig(**model_config), num_hidden_layers=len(layers))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.load_state_dict({local_name(k, layers.start): v for k, v in tensors.items()}, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary = RotaryEmbedding(cfg)
    return model.eval()


class Stage:
    def __init__(self, setup: dict, tensors: dict, tp_group, device: torch.device):
        layers = range(*setup["layers"])
        self.first, self.last = setup["stage"] == 0, setup["stage"] == setup["stages"] - 1
        model = build_stage_model(setup["model_config"], layers, tensors)
        if setup["tp_size"] > 1:
            model = shard_model(model, setup["tp_rank"], setup["tp_size"], tp_group)
        dtype = DTYPES[setup["dtype"]]
        self.model = model_for_engine(model, device, dtype, None)
        self.device, self.dtype, self.hidden_size = device, dtype, model.config.hidden_size
        backend = make_backend(setup["attention_backend"], device, dtype)
        self.kv_cache = PagedKVCache.for_model(self.model, setup["num_kv_blocks"], setup["block_size"], backend)
        if setup["num_swap_blocks"]:
            self.kv_cache.enable_swap(setup["num_swap_blocks"])

    @torch.inference_mode()
    def run(self, seqs: list[dict], receive, send) -> torch.Tensor | None:
        """One step of the plan's sequences. receive(x) fills x with the previous stage's hidden
        states, send(x) passes ours on; returns the last stage's logits of the sampling rows."""
        step = PagedStep.build([s["table"] for s in seqs], [s["start"] for s in seqs],
                               [len(s["tokens"]) for s in seqs], self.kv_cache.block_size, self.device)
        self.kv_cache.set_step(step)
        m = self.model.model
        if self.first:
            ids = [t for s in seqs for t in s["tokens"]]
            x = m.embed_tokens(torch.tensor(ids, device=self.device))
        else:
            x = receive(torch.empty(step.query_starts[-1], self.hidden_size, dtype=self.dtype, device=self.device))
        cos, sin = m.rotary(step.positions)
        for layer in m.layers:
            x = layer(x, cos, sin, self.kv_cache)
        if not self.last:
            send(x)
            return None
        ends = [end - 1 for s, end in zip(seqs, step.query_starts[1:]) if s["sample"]]
        if not ends:
            return None
        hidden = m.norm(x)                           # as LlamaModel.forward, then the sampling rows
        if len(ends) < hidden.shape[0]:
            hidden = hidden[torch.tensor(ends, device=self.device)]
        return self.model.compute_logits(hidden)
