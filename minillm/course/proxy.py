"""Objects that stay on their side of the sandbox's channel, used from the other (`judge.py`
and `serve.py` each hold one `Peer`).

A value crosses as plain data (`wire.py`); any other object crosses as a handle, and the other
side gets a `Proxy` whose attribute reads, attribute writes, calls and container operations go
back over the channel. Both ways: the judge holds proxies of the student's objects (a class, an
instance), and the student's code, inside the sandbox, holds proxies of the objects the grader
hands it (the engine's sequences, its block manager): it can use them as the engine's real
objects, but reads and changes them only through their public face (no `__dunder__` but the
container ones), so it cannot reach the grader's modules, functions or references through them.
A call may call back the other way while it runs (the student's scheduler asks the grader's
block manager `can_allocate(seq)`), so each side keeps answering the other's requests while it
waits for its own reply.
"""
from __future__ import annotations

import itertools
import threading
from collections import deque

from . import wire

CONTAINER_DUNDERS = frozenset({"__len__", "__getitem__", "__setitem__", "__delitem__", "__contains__", "__eq__"})
EXCEPTIONS = {e.__name__: e for e in (AssertionError, ValueError, TypeError, IndexError, KeyError, RuntimeError,
                                      NotImplementedError, ZeroDivisionError, AttributeError, ArithmeticError,
                                      OverflowError, LookupError, StopIteration, RecursionError, MemoryError)}


class ChannelGone(RuntimeError):
    """The other side stopped answering (it ended, was killed, or broke the protocol)."""


class Peer:
    """One side of the channel: its own objects the other side holds handles to, and the
    proxies of the other side's objects it holds. `share_containers`: a list, dict, set or deque
    read from an attribute of one of this side's objects crosses as a handle (changes to it
    land here: the student's code appends to a sequence's block table), not as a copy.
    `extra(request)` answers requests of other kinds (`serve.py`'s names, authorship, get)."""

    def __init__(self, inp, out, share_containers: bool = False, extra=None):
        self.inp, self.out, self.share, self.extra = inp, out, share_containers, extra
        self.lock = threading.RLock()
        self.by_id: dict[int, object] = {}
        self.ids: dict[int, int] = {}
        self.numbers = itertools.count()
        self.proxies: dict[int, Proxy] = {}
        self.raised: dict[int, tuple[BaseException, int]] = {}   # id -> (exception made here, the other's handle)

    # ------------------------------------------------------------ handles
    def ref(self, obj) -> dict:
        if isinstance(obj, Proxy) and object.__getattribute__(obj, "_peer") is self:
            return {"$": "yours", "id": object.__getattribute__(obj, "_id")}
        if self.raised.get(id(obj), (None,))[0] is obj:     # an exception the other side raised, handed back
            return {"$": "yours", "id": self.raised[id(obj)][1]}
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = next(self.numbers)
            self.by_id[self.ids[key]] = obj
        return {"$": "mine", "id": self.ids[key], "kind": type(obj).__name__[:80]}

    def forget(self, obj) -> None:
        """The other side's handle to `obj` no longer works (a reference the judge handed in for
        one check only: kept and called later, it is refused)."""
        n = self.ids.pop(id(obj), None)
        if n is not None:
            self.by_id.pop(n, None)

    def deref(self, data: dict):
        n = int(data["id"])
        if data["$"] == "yours":
            return self._own(n)
        if n not in self.proxies:                      # one proxy per object: `is`, `in` and hashing work
            self.proxies[n] = Proxy(self, n, str(data.get("kind", "")))
        return self.proxies[n]

    def _own(self, n: int):
        if n not in self.by_id:
            raise LookupError("that object is no longer reachable across the sandbox (it was handed in for "
                              "an earlier check only)")
        return self.by_id[n]

    def encode(self, value, blobs: list[bytes]):
        return wire.encode(value, blobs, self.ref)

    def decode(self, data, blobs: list[bytes]):
        return wire.decode(data, blobs, self.deref)

    # ------------------------------------------------------------ asking
    def ask(self, request: dict, blobs=()):
        with self.lock:
            try:
                wire.send(self.out, request, list(blobs))
                while True:
                    reply, got = wire.receive(self.inp)
                    if "op" not in reply:
                        break
                    self.serve(reply, got)                # the other side calls back while it works for us
            except (OSError, ValueError, wire.WireError) as e:
                raise ChannelGone(f"the other side of the grading channel stopped answering ({e})") from None
        if "raised" in reply:
            raised = reply["raised"]
            kind, message = str(raised.get("type", "Exception"))[:80], str(raised.get("message", ""))
            handle = raised.get("handle") if isinstance(raised.get("handle"), dict) else {}
            if handle.get("$") == "yours" and isinstance(self.by_id.get(handle.get("id")), BaseException):
                raise self.by_id[handle["id"]]               # our own exception, let through: the same object
            error = EXCEPTIONS[kind](message) if kind in EXCEPTIONS else RuntimeError(f"{kind}: {message}")
            if handle.get("$") == "mine" and isinstance(handle.get("id"), int):
                self.raised[id(error)] = (error, handle["id"])   # handed back, it is the other side's own again
            raise error
        if "ok" not in reply:
            raise ChannelGone("the other side sent something that is not an answer")
        return self.decode(reply["ok"], got)

    # ------------------------------------------------------------ answering
    def serve(self, request: dict, blobs: list[bytes]) -> None:
        """Answer one request of the other side (any error becomes its answer)."""
        out: list[bytes] = []
        try:
            value = self.answer(request, blobs)
            reply = {"ok": value.data if isinstance(value, _Shared) else self.encode(value, out)}
        except BaseException as e:                        # SystemExit and KeyboardInterrupt included
            out = []
            reply = {"raised": {"type": type(e).__name__, "message": str(e)[:4000],
                                 "handle": self.ref(e)}}
        with self.lock:
            wire.send(self.out, reply, out)

    def answer(self, request: dict, blobs: list[bytes]):
        op = request.get("op")
        if "target" not in request:
            if self.extra is None:
                raise ValueError(f"unknown request {op!r}")
            return self.extra(request)
        target = self._own(int(request["target"]))
        name = request.get("name") or request.get("method")
        if isinstance(name, str) and name.startswith("__") and name not in CONTAINER_DUNDERS:
            raise AttributeError(f"{name} is not reachable across the sandbox")
        if op == "truth":
            return bool(target)
        if op == "list":
            return list(target)
        if op == "methods":                               # a class's methods (a grader subclasses it)
            return sorted(n for n in dir(target) if not n.startswith("__") and callable(getattr(target, n, None)))
        if op == "getattr":
            value = getattr(target, name)
            if self.share and isinstance(value, (list, dict, set, deque)) and \
                    getattr(target, "__dict__", {}).get(name) is value:
                return _Shared(self.ref(value))
            return value
        if op == "setattr":
            setattr(target, name, self.decode(request["value"], blobs))
            return None
        if op == "call":
            args = self.decode(request["args"], blobs)
            kwargs = self.decode(request["kwargs"], blobs)
            method = request.get("method")
            result = (getattr(target, method) if method else target)(*args, **kwargs)
            return {"result": result, "args": [wire.mutable(a) for a in args],
                    "kwargs": {k: wire.mutable(v) for k, v in kwargs.items()}}
        raise ValueError(f"unknown request {op!r}")


class _Shared:
    def __init__(self, data: dict):
        self.data = data


class Proxy:
    """An object that stays on the other side: attributes, calls and container operations go there."""

    def __init__(self, peer: Peer, ident: int, kind: str):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_kind", kind)

    def _ask(self, request: dict, blobs=()):
        return object.__getattribute__(self, "_peer").ask({**request, "target": object.__getattribute__(self, "_id")},
                                                          blobs)

    def __repr__(self):
        return f"<{object.__getattribute__(self, '_kind')} across the sandbox>"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask({"op": "getattr", "name": name})

    def __setattr__(self, name, value):
        blobs: list[bytes] = []
        self._ask({"op": "setattr", "name": name, "value": object.__getattribute__(self, "_peer").encode(value, blobs)},
                  blobs)

    def _call(self, method, args, kwargs):
        peer = object.__getattribute__(self, "_peer")
        blobs: list[bytes] = []
        reply = self._ask({"op": "call", "method": method, "args": peer.encode(list(args), blobs),
                           "kwargs": peer.encode(dict(kwargs), blobs)}, blobs)
        wire.write_back(list(args), reply["args"])
        wire.write_back(dict(kwargs), reply["kwargs"])
        return reply["result"]

    def __call__(self, *args, **kwargs):
        return self._call(None, args, kwargs)

    def __len__(self):
        return self._call("__len__", (), {})

    def __getitem__(self, key):
        return self._call("__getitem__", (key,), {})

    def __setitem__(self, key, value):
        self._call("__setitem__", (key, value), {})

    def __delitem__(self, key):
        self._call("__delitem__", (key,), {})

    def __contains__(self, item):
        return self._call("__contains__", (item,), {})

    def __iter__(self):
        return iter(self._ask({"op": "list"}))

    def __bool__(self):                          # `fn or default`: the object's own truth, not len()
        return self._ask({"op": "truth"}) is True

    def __eq__(self, other):
        if isinstance(other, Proxy):
            return other is self
        return self._call("__eq__", (other,), {}) is True

    __hash__ = object.__hash__

    def __mro_entries__(self, bases):
        """`class Counting(yours)` in a grader (lesson 06 counts your swaps): a local class whose
        instances hold an instance of yours across the sandbox and forward to it what the
        subclass does not define, `super()` calls included."""
        return (_local_base(self),)


def _local_base(remote_cls: Proxy) -> type:
    names = remote_cls._ask({"op": "methods"})

    def forward(name):
        def method(self, *args, **kwargs):
            return getattr(object.__getattribute__(self, "_remote"), name)(*args, **kwargs)
        method.__name__ = name
        return method

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_remote", remote_cls(*args, **kwargs))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "_remote"), name)

    def __setattr__(self, name, value):
        if any(name in vars(k) for k in type(self).__mro__[:-2]):      # the subclass's own attribute
            object.__setattr__(self, name, value)
        else:
            setattr(object.__getattribute__(self, "_remote"), name, value)

    space = {n: forward(n) for n in names if not n.startswith("__")}
    space.update(__init__=__init__, __getattr__=__getattr__, __setattr__=__setattr__)
    return type(f"{object.__getattribute__(remote_cls, '_kind')}AcrossTheSandbox", (), space)
