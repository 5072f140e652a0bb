"""The adapters a server serves by name (lesson 13; vLLM's `--lora-modules`).

    serve --enable-lora --lora-modules sql=/adapters/sql chat=/adapters/chat
    {"model": "sql", ...}        -> runs with LoRARequest("sql", 1, "/adapters/sql")
    {"model": "<base name>"}     -> the base model;  any other name -> 404 naming `model`

Ids are given from 1 in the order adapters arrive and never reused: an adapter unloaded and
loaded again gets a new id, so the prefix cache (keyed by id and path) never mixes them.
An adapter is read and checked when it arrives (at startup, or by /v1/load_lora_adapter in
a worker thread, off the event loop); its host copy is handed to the engine's LoRAManager
then, so the engine loop never reads safetensors. Handing it over from this thread is one
dict assignment under a fresh id that no sequence uses yet: the loop only ever reads it later.
"""
from __future__ import annotations

import asyncio
import json

from ..lora.adapter import load_adapter
from ..lora.request import LoRARequest
from .errors import APIError
from .responses import ModelCard


def parse_lora_modules(items: list[str] | None) -> list[tuple[str, str]]:
    """`name=path` or vLLM's JSON `{"name": ..., "path": ...}` -> [(name, path)], or a ValueError."""
    pairs = []
    for item in items or []:
        if item.lstrip().startswith("{"):
            try:
                spec = json.loads(item)
            except json.JSONDecodeError as e:
                raise ValueError(f"--lora-modules: {item!r:.80} is not valid JSON ({e})") from None
            name, path = (spec.get("name"), spec.get("path")) if isinstance(spec, dict) else (None, None)
        else:
            name, _, path = item.partition("=")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError(f"--lora-modules: {item!r:.80} must be name=path or "
                             '{"name": "...", "path": "..."}')
        pairs.append((name, path))
    return pairs


class ServedAdapters:
    """Adapter names -> LoRARequests; `manager` is the engine's LoRAManager (None: no --enable-lora)."""

    def __init__(self, base_name: str, manager=None):
        self.base_name, self.manager = base_name, manager
        self.by_name: dict[str, LoRARequest] = {}
        self.next_id = 1
        self._arriving: set[str] = set()         # names being loaded now (a second load of one is refused)

    def __contains__(self, name) -> bool:
        return name in self.by_name

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names; None for the base model; else a 404 naming `model`."""
        if model is None or model == self.base_name:
            return None
        lora = self.by_name.get(model)
        if lora is None:
            served = ", ".join(repr(n) for n in [self.base_name, *self.by_name])
            raise APIError(404, f"the model '{model}' does not exist; this server serves {served}",
                           "model", "model_not_found")
        return lora

    def cards(self, created: int, max_model_len: int) -> list[ModelCard]:
        return [ModelCard(id=name, created=created, max_model_len=max_model_len, root=lora.lora_path,
                          parent=self.base_name) for name, lora in self.by_name.items()]

    def card(self, name: str, created: int, max_model_len: int) -> ModelCard | None:
        return next((c for c in self.cards(created, max_model_len) if c.id == name), None)

    # -- adding and removing ----------------------------------------------------------------
    def _reserve(self, name, path) -> LoRARequest:
        if self.manager is None:
            raise APIError(400, "this server was started without --enable-lora: it serves no adapters",
                           "lora_name")
        for field, value in (("lora_name", name), ("lora_path", path)):
            if not isinstance(value, str) or not value:
                raise APIError(400, f"{field} must be a non-empty string, got {value!r:.80}", field)
        if name == self.base_name or name in self.by_name or name in self._arriving:
            raise APIError(400, f"the name '{name}' is taken (the base model or a loaded adapter): "
                                "unload it first, or pick another", "lora_name")
        self._arriving.add(name)
        lora = LoRARequest(name, self.next_id, path)
        self.next_id += 1
        return lora

    def _read(self, lora: LoRARequest):
        m = self.manager
        return load_adapter(lora.lora_path, m.num_layers, m.shapes, m.max_lora_rank, lora.lora_name)

    def _commit(self, lora: LoRARequest, adapter) -> None:
        self.manager.adapters[lora.lora_int_id] = (lora, adapter)      # module doc: a fresh id
        self.by_name[lora.lora_name] = lora

    def add_now(self, name: str, path: str) -> LoRARequest:
        """At startup (--lora-modules): read and check the folder now; a ValueError names the field."""
        try:
            lora = self._reserve(name, path)
        except APIError as e:
            raise ValueError(f"--lora-modules {name}={path}: {e.message}") from None
        try:
            self._commit(lora, self._read(lora))
        finally:
            self._arriving.discard(name)
        return lora

    async def add(self, name, path) -> LoRARequest:
        """At runtime: the folder is read in a worker thread; a bad one is a 400 naming the field."""
        lora = self._reserve(name, path)
        try:
            adapter = await asyncio.to_thread(self._read, lora)
        except ValueError as e:
            raise APIError(400, str(e), getattr(e, "param", None) or "lora_path") from None
        finally:
            self._arriving.discard(name)
        self._commit(lora, adapter)
        return lora

    def remove(self, name) -> LoRARequest:
        """New requests for `name` get a 404 from now on; requests already running with it finish
        (they hold their LoRARequest). The host copy stays with the engine under its old id."""
        lora = self.by_name.pop(name, None) if isinstance(name, str) else None
        if lora is None:
            raise APIError(404, f"no adapter named {name!r:.80} is loaded", "lora_name", "model_not_found")
        return lora
