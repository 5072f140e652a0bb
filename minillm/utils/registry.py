"""One registry type for everything pluggable by name: attention backends, linear backends.

An entry is a class, or a "module:attribute" string for the built-in ones, imported on
first use. Why strings: `config.py` sits below everything and validates option names
against these registries; with strings it knows every name without importing a single
implementation (Triton, the C kernels, the quantized linears).

    from minillm.utils.registry import ATTENTION_BACKENDS
    @ATTENTION_BACKENDS.register("mine")          # then LLM(attention_backend="mine")
    class MyAttention(AttentionBackend): ...

Registering a name again replaces it (a notebook cell run twice). An unknown name is a
ValueError that lists the names the registry knows.
"""
from __future__ import annotations

import importlib


class Registry:
    def __init__(self, kind: str, builtins: dict[str, str] | None = None, check=None):
        """kind: what the entries are, for messages ("attention backend"). builtins: name ->
        "module:attribute". check(cls): raises TypeError if cls cannot serve as an entry."""
        self.kind = kind
        self._entries: dict[str, object] = dict(builtins or {})
        self._check = check

    def register(self, name: str | None = None):
        """Class decorator: add the class under `name` (default: its `name` attribute)."""
        def add(cls):
            key = name if name is not None else getattr(cls, "name", None)
            if not isinstance(key, str) or not key:
                raise TypeError(f"a {self.kind} needs a non-empty string name, {cls!r} has {key!r}")
            if self._check is not None:
                self._check(cls)
            self._entries[key] = cls
            return cls
        return add

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str):
        return self.get(name)

    def __setitem__(self, name: str, cls) -> None:
        self.register(name)(cls)

    def pop(self, name: str, default=None):
        """Take an entry out (a test's temporary backend)."""
        return self._entries.pop(name, default)

    def get(self, name: str):
        """The class registered under `name` (imported now if it is a built-in)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry

    def items(self):
        return [(name, self.get(name)) for name in self._entries]

    def values(self):
        return [self.get(name) for name in self._entries]


ATTENTION_BACKENDS = Registry("attention backend", {
    "torch": "minillm.attention.paged:TorchPagedAttention",
    "cpu-kernel": "minillm.attention.cpu_paged:CPUPagedAttention",
    "triton": "minillm.attention.triton_backend:TritonPagedAttention",
})


def _check_linear_backend(cls) -> None:
    if not callable(getattr(cls, "from_linear", None)):
        raise TypeError(f"a linear backend needs a classmethod from_linear(linear, **options); {cls!r} has none")


LINEAR_BACKENDS = Registry("quantization", {
    "int8": "minillm.quant.int8:Int8Linear",
    "int4": "minillm.quant.int4:Int4Linear",
    "w4a8": "minillm.quant.w4a8:W4A8Linear",
}, check=_check_linear_backend)
