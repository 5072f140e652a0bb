"""Which adapters sit in the model's slots: at most `max_loras` at once, the rest in host memory.

Every loaded adapter stays in host memory (its A and B in float32); the model holds
`max_loras` slots (layers.py) that a step's rows gather from. An adapter a request needs
comes into a slot when it is admitted: a free slot if there is one, else the least recently
used slot whose adapter no running sequence uses. When every slot serves running work, the
request waits in the queue (the scheduler asks `acquire` before admitting it): it is never
run with a slot that holds another adapter's weights.
"""
from __future__ import annotations

from collections import OrderedDict


class AdapterSlots:
    def __init__(self, max_loras: int, load_slot):
        """`load_slot(slot, lora_int_id)` writes that adapter's weights into the slot."""
        self.max_loras = max_loras
        self.load_slot = load_slot
        self.slot_of: "OrderedDict[int, int]" = OrderedDict()   # adapter id -> slot, least recent first
        self.num_loads = 0                                       # adapters copied into a slot
        self.num_evictions = 0

    def acquire(self, lora_int_id: int, busy: set[int]) -> int | None:
        """The slot holding the adapter, loading it if needed, or None: every slot holds an
        adapter in `busy` (used by a running sequence), so the caller waits."""
        if lora_int_id in self.slot_of:
            self.slot_of.move_to_end(lora_int_id)
            return self.slot_of[lora_int_id]
        taken = set(self.slot_of.values())
        free = next((s for s in range(self.max_loras) if s not in taken), None)
        if free is None:
            victim = next((i for i in self.slot_of if i not in busy), None)     # least recently used first
            if victim is None:
                return None
            free = self.slot_of.pop(victim)
            self.num_evictions += 1
        self.load_slot(free, lora_int_id)
        self.slot_of[lora_int_id] = free
        self.num_loads += 1
        return free

    def drop(self, lora_int_id: int) -> None:
        """Forget the adapter's slot (it was unloaded); the slot is free for another."""
        self.slot_of.pop(lora_int_id, None)
