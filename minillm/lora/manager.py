"""The engine's LoRA: adapters checked at the door, slots filled on admission, rows tagged per step.

    add_request(..., lora_request)  ──► register: load + check the folder (host memory), or a ValueError
    scheduler admits a sequence     ──► admit: its adapter gets a slot, or the sequence waits
    runner lays out a step          ──► set_step: each row's slot, read by every LoRALinear

Built by `attach_lora` when EngineConfig.enable_lora is set; the engine's scheduler asks
`admit` before it brings a sequence in, the runner calls `set_step` before each forward.

Two ways to add the deltas, same numbers: "grouped" (batched_delta.grouped_delta, per adapter
and sub-projection: the lesson's) and "packed" (packed_delta.py: a few calls per linear
whatever the number of adapters). `DEFAULT_DELTA` picks one for new engines, `use_delta` switches one:
"packed", because `python -m minillm bench lora` measured it faster at every adapter count (2-core Xeon,
float32, the throughput workload: 1 / 4 / 16 adapters at 0.85x / 0.94x / 0.87x the base model's
tok/s, against grouped's 0.84x / 0.85x / 0.76x; 1,875 operations per decode step against 28,688).
"""
from __future__ import annotations

import torch

from .adapter import TARGETS, LoRAAdapter, load_adapter
from .layers import wrap_model
from .packed_delta import StepLayout
from .request import LoRARequest
from .slots import AdapterSlots
from ..utils.validate import refuse

DELTAS = ("grouped", "packed")
DEFAULT_DELTA = "packed"


class LoRAManager:
    def __init__(self, model, max_loras: int, max_lora_rank: int):
        cfg = model.config
        self.max_lora_rank = max_lora_rank
        self.num_layers = cfg.num_hidden_layers
        hidden, d = cfg.hidden_size, cfg.head_dim
        q, kv, inter = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
        self.shapes = {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
                       "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
        assert set(self.shapes) == set(TARGETS)
        self.rows, self.layers = wrap_model(model, max_loras, max_lora_rank)
        self.adapters: dict[int, tuple[LoRARequest, LoRAAdapter]] = {}     # host memory, by lora_int_id
        self.slots = AdapterSlots(max_loras, self._load_slot)
        self.delta = DEFAULT_DELTA

    def use_delta(self, name: str) -> None:
        """Add the deltas the "grouped" way or the "packed" way (module doc), from the next step on."""
        if name not in DELTAS:
            refuse("delta", f"the LoRA delta is one of {', '.join(DELTAS)}, got {name!r:.40}")
        self.delta = name

    def register(self, lora_request) -> None:
        """Load the adapter into host memory (once per id), or refuse it with a ValueError naming the field."""
        if not isinstance(lora_request, LoRARequest):
            refuse("lora_request", f"lora_request must be a LoRARequest, got {type(lora_request).__name__}", TypeError)
        known = self.adapters.get(lora_request.lora_int_id)
        if known is not None:
            if known[0].lora_path != lora_request.lora_path:
                refuse("lora_int_id", f"lora_int_id {lora_request.lora_int_id} is already adapter "
                                      f"{known[0].lora_name!r} from {known[0].lora_path}, not {lora_request.lora_path}")
            return
        adapter = load_adapter(lora_request.lora_path, self.num_layers, self.shapes, self.max_lora_rank,
                               lora_request.lora_name)
        self.adapters[lora_request.lora_int_id] = (lora_request, adapter)

    def admit(self, seq, running) -> bool:
        """May `seq` be brought in now? Yes for the base model, or once its adapter holds a slot
        (loaded now if a slot is free or held by an adapter no running sequence uses)."""
        lora = getattr(seq, "lora_request", None)
        if lora is None:
            return True
        busy = {s.lora_request.lora_int_id for s in running if getattr(s, "lora_request", None) is not None}
        return self.slots.acquire(lora.lora_int_id, busy) is not None

    @torch.no_grad()
    def _load_slot(self, slot: int, lora_int_id: int) -> None:
        _, adapter = self.adapters[lora_int_id]
        for layer_idx, linears in enumerate(self.layers):
            mine = {name: ab for (i, name), ab in adapter.weights.items() if i == layer_idx}
            for linear in {id(m): m for m in linears.values()}.values():
                linear.load(slot, {n: ab for n, ab in mine.items() if n in dict(linear.subs)})
        self.rows.scale[slot] = adapter.scaling

    def set_step(self, scheduled) -> None:
        """Tag this step's rows ([(sequence, tokens fed)], in the runner's order) with their slots;
        None clears. A sequence whose adapter holds no slot is an error, never another adapter's weights."""
        rows = self.rows
        slots = [] if scheduled is None else [self._slot(seq) for seq, _ in scheduled]
        if not any(s >= 0 for s in slots):
            rows.slot_of_row, rows.slots_present, rows.layout = None, [], None
            return
        per_row = [s for s, (_, n) in zip(slots, scheduled) for _ in range(n)]
        rows.slot_of_row = torch.tensor(per_row, device=rows.scale.device)
        rows.slots_present = sorted({s for s in slots if s >= 0})
        rows.layout = StepLayout.build(per_row, rows.scale.device) if self.delta == "packed" else None

    def _slot(self, seq) -> int:
        lora = getattr(seq, "lora_request", None)
        if lora is None:
            return -1
        slot = self.slots.slot_of.get(lora.lora_int_id)
        if slot is None:
            raise RuntimeError(f"adapter {lora.lora_name!r} (id {lora.lora_int_id}) holds no slot: the scheduler "
                               "ran its sequence without admitting it (LoRAManager.admit)")
        return slot


def refuse_lora_combinations(config) -> None:
    """What enable_lora does not combine with yet, refused by name before anything is built.
    Quantized base weights do combine: a LoRALinear wraps the quantized linear (layers.py)."""
    spec = config.speculative_config
    method = getattr(spec, "method", None)
    why = {"tensor_parallel_size": (config.tensor_parallel_size > 1,
                                    f"tensor_parallel_size={config.tensor_parallel_size} (--tensor-parallel-size)",
                                    "the adapters' A and B are not sharded across ranks like their base linears; "
                                    "serve adapters with --tensor-parallel-size 1"),
           "compile": (config.compile, "compile=True (--compile)",
                       "the compiled decode graph has no per-row LoRA delta; drop --compile"),
           "speculative_config": (spec is not None and method != "ngram",
                                  f"speculative_config method {method!r} (--speculative-config)",
                                  "its draft would run without the request's adapter; use method 'ngram' "
                                  "(drafts from the prompt, verified with the adapter) or no speculation")}
    for field, (on, what, fix) in why.items():
        if on:
            refuse(field, f"enable_lora=True (--enable-lora) with {what} is not supported: {fix}")


def register_lora(manager: LoRAManager | None, lora_request) -> None:
    """add_request's door check: a request's adapter loads (or is refused) before anything is queued."""
    if lora_request is None:
        return
    if manager is None:
        refuse("lora_request", "a lora_request needs an engine built with enable_lora=True")
    manager.register(lora_request)


def attach_lora(runner, scheduler, config) -> LoRAManager:
    """LoRA slots on the runner's model; the scheduler's admission and the runner's steps consult them."""
    manager = LoRAManager(runner.model, config.max_loras, config.max_lora_rank)
    runner.lora = manager
    scheduler.lora_gate = manager.admit
    return manager
