"""Stored responses, so a request can continue one by `previous_response_id` (as vLLM keeps them:
in this process's memory, gone on restart).

Each entry keeps only what its own turn added (the new input messages and the model's answer)
and the id it continued; a conversation is read back by walking that chain. Memory is thus
linear in the turns, not quadratic. The store is bounded by count and evicts the least recently
used response: a continuation of an evicted one (or of any response whose ancestor was evicted)
is a 400 naming previous_response_id, never a silent restart of the conversation.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import APIError

DEFAULT_MAX_STORED = 1024


@dataclass
class Entry:
    previous: str | None          # the response this one continued
    messages: list[dict]          # chat messages this turn added: its input, then its answer
    response: dict                # the Response as sent (GET /v1/responses/{id})


class ResponseStore:
    def __init__(self, max_entries: int = DEFAULT_MAX_STORED):
        if max_entries < 1:
            raise ValueError(f"the response store needs room for at least 1 response, got {max_entries}")
        self.max_entries = max_entries
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.lock = threading.Lock()

    def put(self, response_id: str, entry: Entry) -> None:
        with self.lock:
            self.entries[response_id] = entry
            self.entries.move_to_end(response_id)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)

    def get(self, response_id: str) -> Entry | None:
        with self.lock:
            entry = self.entries.get(response_id)
            if entry is not None:
                self.entries.move_to_end(response_id)
            return entry

    def conversation(self, response_id: str, max_messages: int) -> list[dict]:
        """The chat messages of the conversation that ends with `response_id`, oldest first."""
        chain, at = [], response_id
        while at is not None:
            entry = self.get(at)
            if entry is None:
                which = "it" if at == response_id else f"the response it continues ({at})"
                raise APIError(400, f"previous_response_id {response_id!r} is not stored: {which} was never "
                                    f"stored (store=false) or was evicted (this server keeps the last "
                                    f"{self.max_entries} responses)", "previous_response_id", "response_not_found")
            chain.append(entry.messages)
            at = entry.previous
            if sum(len(m) for m in chain) > max_messages:
                raise APIError(400, f"the conversation of previous_response_id {response_id!r} has more than "
                                    f"{max_messages} messages", "previous_response_id")
        return [m for messages in reversed(chain) for m in messages]
