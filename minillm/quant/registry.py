"""The linear-backend registry: the quantization seam.

A backend is an nn.Module class with a `name` and a classmethod
`from_linear(linear, **options)` that turns a float linear (nn.Linear or PanelLinear:
anything with `weight` [out, in] and `bias`) into a module computing the same
`y = x @ W.T + b` from its own stored form of W. Each registers its name once; the
engine option `quantization=`, the CLI and the server flags read this registry, so a
learner's class plugs in with one call:

    register_linear_backend(MyInt8Linear)      # then LLM(..., quantization="my-int8")
"""
from __future__ import annotations

LINEAR_BACKENDS: dict[str, type] = {}


def register_linear_backend(cls: type) -> type:
    """Add `cls` under `cls.name` (registering a name again replaces it: a notebook cell run
    twice). Returns cls, so it also works as a class decorator."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"a linear backend needs a non-empty string `name`, {cls!r} has {name!r}")
    if not callable(getattr(cls, "from_linear", None)):
        raise TypeError(f"a linear backend needs a classmethod from_linear(linear, **options); {cls!r} has none")
    LINEAR_BACKENDS[name] = cls
    return cls


def quantization_names() -> tuple[str, ...]:
    """What `quantization=` accepts (besides None, which keeps the float weights)."""
    return tuple(LINEAR_BACKENDS)
