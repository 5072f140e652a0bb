"""Plain data between the grader and the sandbox: JSON plus raw tensor bytes, never pickle.

A message is an 8-byte length, a JSON header, then the tensors' bytes it names. Values:
None, bools, ints, floats, strings, lists, tuples, sets, dicts, bytes, ranges, tensors (dtype, shape,
bytes), `torch.Generator`s (their state; one generator named twice in a message arrives as one
object, so rows that share a generator keep drawing from one stream), dtypes, devices, slices,
deques, the package's enums (by name) and plain dataclasses (`SamplingParams`, a step's
`PagedStep`, a `SchedulerOutput`: by a fixed list of names), the course tokenizer and tiny model
(by name: each side has its own, built the same), and handles to objects that stay on their side
(`{"$": "mine" | "yours"}`, `proxy.py`).
Decoding builds only those types: what comes out of a sandbox can be wrong, never code.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import struct
import sys
from collections import deque

import torch

LIMIT = 256 << 20                   # the largest message read (bytes)
DATACLASSES = {"minillm.sampling_params:SamplingParams", "minillm.attention.paged:PagedStep",
               "minillm.engine.scheduler:SchedulerOutput"}
DTYPES = {str(d).split(".")[1]: d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                                            torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)}


_made: dict[str, object] = {}
_fields: dict[type, list[str]] = {}


class WireError(RuntimeError):
    """A message that is not one (too big, cut short, an unknown type)."""


def encode(value, blobs: list[bytes], ref=None, _seen: dict | None = None):
    """`value` as JSON-able data; tensors' bytes appended to `blobs`; `ref(obj)` gives the handle
    of anything else (None: anything else is an error)."""
    if _seen is None:
        _seen = {}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if not isinstance(value, int) or isinstance(value, bool) or abs(value) < 2 ** 63 else str(value)
    if isinstance(value, (list, tuple, set, frozenset, deque)):
        base = next(t for t in (deque, list, tuple, frozenset, set) if isinstance(value, t))
        return {"$": base.__name__, "v": [encode(v, blobs, ref, _seen) for v in value]}
    if isinstance(value, range):
        return {"$": "range", "v": [value.start, value.stop, value.step]}
    if isinstance(value, slice):
        return {"$": "slice", "v": [encode(v, blobs, ref, _seen) for v in (value.start, value.stop, value.step)]}
    if isinstance(value, enum.Enum) and type(value).__module__.startswith("minillm."):
        return {"$": "enum", "type": f"{type(value).__module__}:{type(value).__qualname__}", "name": value.name}
    if isinstance(value, dict):
        return {"$": "dict", "v": [[encode(k, blobs, ref, _seen), encode(v, blobs, ref, _seen)]
                                   for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        blobs.append(bytes(value))
        return {"$": "bytes", "b": len(blobs) - 1}
    if isinstance(value, torch.Tensor) and value.dtype in DTYPES.values() and not value.is_sparse:
        t = value.detach().to("cpu").contiguous()
        blobs.append(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"$": "tensor", "dtype": str(t.dtype).split(".")[1], "shape": list(t.shape), "b": len(blobs) - 1}
    if isinstance(value, torch.dtype) and str(value).split(".")[1] in DTYPES:
        return {"$": "dtype", "name": str(value).split(".")[1]}
    if isinstance(value, torch.device):
        return {"$": "device", "v": str(value)}
    if isinstance(value, torch.Generator):
        if id(value) not in _seen:
            blobs.append(value.get_state().numpy().tobytes())
            _seen[id(value)] = len(blobs) - 1
        return {"$": "generator", "b": _seen[id(value)]}
    name = f"{type(value).__module__}:{type(value).__qualname__}"
    if name in DATACLASSES and dataclasses.is_dataclass(value):
        fields = _fields.setdefault(type(value), [f.name for f in dataclasses.fields(value) if f.init])
        return {"$": "data", "type": name, "v": encode({f: getattr(value, f) for f in fields}, blobs, ref, _seen)}
    if _is_course_tokenizer(value):
        return {"$": "tokenizer", "name": "tiny-llama"}
    if _is_course_model(value):
        return {"$": "model", "name": "tiny-llama"}
    if ref is not None:
        return ref(value)
    raise WireError(f"cannot send a {type(value).__name__} across the sandbox")


def decode(data, blobs: list[bytes], ref=None, _made_here: dict | None = None):
    """The value `encode` described; `ref(id)` gives the object a handle names."""
    if _made_here is None:
        _made_here = {}
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if not isinstance(data, dict) or not isinstance(data.get("$"), str):
        raise WireError(f"not a value: {str(data)[:80]}")
    kind = data["$"]
    if kind in ("list", "tuple", "set", "frozenset", "deque"):
        items = [decode(v, blobs, ref, _made_here) for v in data["v"]]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "deque": deque}[kind](items)
    if kind == "slice":
        return slice(*[decode(v, blobs, ref, _made_here) for v in data["v"]][:3])
    if kind == "range":
        start, stop, step = (int(v) for v in data["v"][:3])
        return range(start, stop, step)
    if kind == "enum":
        module, name = str(data["type"]).split(":")
        cls = getattr(importlib.import_module(module), name) if module.startswith("minillm.") else None
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise WireError(f"not one of the package's enums: {data['type']}")
        return cls[str(data["name"])]
    if kind in ("tokenizer", "model"):          # the course tokenizer or tiny model, loaded on this side
        from ..checks.harness import tiny_model
        return tiny_model()[1 if kind == "tokenizer" else 0]
    if kind == "dict":
        return {_key(decode(k, blobs, ref, _made_here)): decode(v, blobs, ref, _made_here) for k, v in data["v"]}
    if kind == "bytes":
        return blobs[int(data["b"])]
    if kind == "tensor":
        dtype = DTYPES[data["dtype"]]
        shape = [int(n) for n in data["shape"]]
        raw = bytearray(blobs[int(data["b"])])
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(shape).clone()
    if kind == "dtype":
        return DTYPES[str(data["name"])]
    if kind == "device":
        return torch.device(str(data["v"]))
    if kind == "generator":
        b = int(data["b"])
        if ("generator", b) not in _made_here:
            _made_here["generator", b] = g = torch.Generator()
            g.set_state(torch.frombuffer(bytearray(blobs[b]), dtype=torch.uint8).clone())
        return _made_here["generator", b]
    if kind == "data" and data.get("type") in DATACLASSES:
        module, name = data["type"].split(":")
        key = json.dumps(data, sort_keys=True)
        if '"b":' in key:                       # holds tensors or bytes: the key does not say which
            return getattr(importlib.import_module(module), name)(**decode(data["v"], blobs, ref, _made_here))
        if key not in _made:                    # the same parameters come again and again: built once
            cls = getattr(importlib.import_module(module), name)
            _made[key] = cls(**decode(data["v"], blobs, ref))
        return _made[key]
    if kind in ("mine", "yours") and ref is not None:
        return ref(data)
    raise WireError(f"unknown value type {kind!r}")


def _is_course_tokenizer(value) -> bool:
    """The course tokenizer the graders hand to a student's class (`harness.tiny_model()`): sent
    by name, each side has its own."""
    harness = sys.modules.get("minillm.checks.harness")
    return type(value).__name__ == "Tokenizer" and harness is not None and value is harness.tiny_model()[1]


def _is_course_model(value) -> bool:
    """The tiny random Llama the graders hand to a student's function (`harness.tiny_model()`):
    sent by name, each side builds its own (seeded: the same weights)."""
    harness = sys.modules.get("minillm.checks.harness")
    return type(value).__name__ == "LlamaForCausalLM" and harness is not None and value is harness.tiny_model()[0]


def _key(k):
    if isinstance(k, (list, dict, bytearray, torch.Tensor)):
        raise WireError("a dict key must be a plain value")
    return k


# ---------------------------------------------------------------- what a call changed in its arguments

# plain dataclasses a call may fill in (lesson 06's `_preempt(seq, out)` lists seq in out.preempted)
WRITTEN_BACK = frozenset({"SchedulerOutput"})


def mutable(value):
    """An argument as sent back (what the call may have changed in it), else None."""
    if type(value).__name__ in WRITTEN_BACK and dataclasses.is_dataclass(value):
        return value
    return value if isinstance(value, (list, dict, torch.Tensor, torch.Generator, bytearray)) else None


def write_back(mine, theirs) -> None:
    """What the other side's code did to its arguments, done to ours too."""
    if theirs is None:
        return
    if isinstance(mine, list) and isinstance(theirs, list):
        for a, b in zip(mine, theirs):
            write_back(a, b)
        if [type(x) for x in mine] != [type(x) for x in theirs] or not all(
                isinstance(x, (torch.Tensor, torch.Generator, list, dict)) for x in mine):
            mine[:] = theirs
    elif isinstance(mine, dict) and isinstance(theirs, dict):
        for k in mine:
            if k in theirs:
                write_back(mine[k], theirs[k])
    elif isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor):
        if mine.shape == theirs.shape and mine.dtype == theirs.dtype:
            mine.copy_(theirs)
    elif isinstance(mine, torch.Generator) and isinstance(theirs, torch.Generator):
        mine.set_state(theirs.get_state())
    elif type(mine) is type(theirs) and type(mine).__name__ in WRITTEN_BACK:
        for f in dataclasses.fields(mine):
            ours, got = getattr(mine, f.name), getattr(theirs, f.name)
            if isinstance(ours, list) and isinstance(got, list):
                ours[:] = got
            else:
                setattr(mine, f.name, got)


def send(stream, header: dict, blobs: list[bytes]) -> None:
    head = json.dumps({**header, "blobs": [len(b) for b in blobs]}).encode()
    stream.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    stream.flush()


def _exactly(stream, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            raise WireError("the other side closed the channel")
        out += chunk
    return bytes(out)


def receive(stream) -> tuple[dict, list[bytes]]:
    (n,) = struct.unpack("<Q", _exactly(stream, 8))
    if n > LIMIT:
        raise WireError(f"a message of {n} bytes (at most {LIMIT})")
    header = json.loads(_exactly(stream, n))
    sizes = header.pop("blobs", [])
    if not isinstance(sizes, list) or sum(int(s) for s in sizes) > LIMIT:
        raise WireError("message too large")
    return header, [_exactly(stream, int(s)) for s in sizes]
