"""Lesson 07's collect half for `check_request_stream` (`course/collect.py`): what the learner's
RequestStream does, as data, judged by `lesson07_stream`.

`collect_stream(cls, part, seed)` runs, for part "unit", each scenario of the grader on a real
event loop in debug mode (which refuses a non-thread-safe call from another thread) with a fake
engine thread delivering outputs, and records what the handler got, what the stream sent the
front, what it raised and whether it hung; for part "server", the real server built with
`build_app(..., stream_cls=cls)` on the tiny random Llama: the text it streamed for a prompt and,
after a client hangs up mid-stream, whether the engine got an abort and how many KV blocks are
still taken. The request ids and the prompt come from the seed (the judge's, while grading). It
holds no expected value and decides nothing; every wait has a timeout.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from types import SimpleNamespace

from .collected import error
from .harness import tiny_model

TIMEOUT = 5.0
PROMPTS = ("The capital of France is", "Once upon a time there", "The best way to learn is", "My favourite colour")


def ids_for(seed: int | None) -> str:
    """The request ids' prefix: none in a notebook (r-0, x-0, ...), from the seed while grading."""
    return "" if seed is None else f"g{seed % 10 ** 6}"


def prompt_for(seed: int | None) -> str:
    return PROMPTS[0] if seed is None else PROMPTS[seed % len(PROMPTS)]


class Front:
    """Stands in for the AsyncEngine: records the commands a stream sends it."""

    def __init__(self):
        self.sent = []

    def send(self, command):
        self.sent.append(command)


def output(rid, finished=False):
    return SimpleNamespace(request_id=rid, finished=finished, outputs=[])


def _data(value, depth: int = 4):
    """What the learner's code handed over, as data (anything else by its repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and depth:
        items = [_data(v, depth - 1) for v in value[:50]]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, (set, frozenset)) and depth:
        return sorted(str(v) for v in value)
    return {"repr": repr(value)[:200]}


def _run(coro_fn, give_up=lambda: False) -> dict:
    """coro_fn() on a fresh event loop in debug mode, in a thread of its own (a notebook's thread
    already runs one): {"result": ...}, {"error": ...} or {"hung": True}; `give_up()` true ends
    the wait early. A hung task is cancelled; one that cannot even be cancelled (a wakeup lost to
    a non-thread-safe call never comes) has its coroutine closed."""
    box = {}

    def worker():
        loop = asyncio.new_event_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = 60
        asyncio.set_event_loop(loop)
        task = loop.create_task(coro_fn())
        try:
            deadline = time.monotonic() + TIMEOUT
            while not task.done() and not give_up() and time.monotonic() < deadline:
                loop.run_until_complete(asyncio.wait({task}, timeout=0.05))
            if task.done():
                loop.run_until_complete(loop.shutdown_asyncgens())
                box["result"] = task.result()
            else:
                task.cancel()
                loop.run_until_complete(asyncio.wait({task}, timeout=0.5))
        except BaseException as e:        # noqa: BLE001 - handed to the judge as data
            box["error"] = error(e)
        finally:
            if not task.done():           # a lost wakeup: even cancel() cannot reach the task
                task._log_destroy_pending = False
                try:
                    task.get_coro().close()
                except BaseException:     # noqa: BLE001 - whatever the learner's code does on close
                    pass
            asyncio.set_event_loop(None)
            loop.close()

    thread = threading.Thread(target=worker, name="check-request-stream", daemon=True)
    thread.start()
    thread.join(TIMEOUT + 30)
    if "error" in box:
        return {"error": box["error"]}
    return {"result": box["result"]} if "result" in box else {"hung": True}


def _deliveries(cls, ids, outs) -> dict:
    """Items delivered from another thread, as the engine loop does, while the handler iterates."""
    got, errors = [], []

    def engine_thread(stream):
        try:
            for out in outs:
                time.sleep(0.01)
                stream.deliver(("output", out))
        except Exception as e:            # noqa: BLE001 - reported by the judge
            errors.append(e)

    async def handler():
        stream = cls(Front(), ids, ["p"] * len(ids), [None] * len(ids), 0)
        await asyncio.sleep(0.05)                      # ...so that the handler waits when items arrive
        threading.Thread(target=engine_thread, args=(stream,), daemon=True).start()
        async for item in stream:
            got.append(item)
        return None

    status = _run(handler, give_up=lambda: bool(errors))

    def item(x):                                       # (index, which delivered output) or its repr
        if isinstance(x, tuple) and len(x) == 2:
            which = next((j for j, o in enumerate(outs) if o is x[1]), None)
            return ("pair", _data(x[0], 0), which if which is not None else repr(x[1])[:200])
        return ("other", repr(x)[:200])
    return {**status, "got": [item(x) for x in got], "errors": [error(e) for e in errors[:1]]}


async def _drain(stream):
    async for _ in stream:
        pass


def collect_unit(cls, seed: int | None = None) -> dict:
    """Each scenario of the grader alone (the module docstring); stops at a hang or an error."""
    p = ids_for(seed)
    data = {}
    one = [output(f"{p}r-0"), output(f"{p}r-0"), output(f"{p}r-0", finished=True)]
    data["one"] = _deliveries(cls, [f"{p}r-0"], one)
    if "result" not in data["one"]:
        return data
    two = [output(f"{p}x-0"), output(f"{p}x-1"), output(f"{p}x-0", finished=True), output(f"{p}x-1"),
           output(f"{p}x-1", finished=True)]
    data["two"] = _deliveries(cls, [f"{p}x-0", f"{p}x-1"], two)
    if "result" not in data["two"]:
        return data

    async def failure():
        stream = cls(Front(), [f"{p}f-0"], ["p"], [None], 0)
        stream.deliver(("output", output(f"{p}f-0")))
        stream.deliver(("failed", RuntimeError("the engine loop failed")))
        try:
            async for _ in stream:
                pass
        except RuntimeError as e:
            return str(e)
        return None

    async def leave():
        front = Front()
        stream = cls(front, [f"{p}a-0", f"{p}a-1"], ["p", "p"], [None, None], 0)
        stream.deliver(("output", output(f"{p}a-0", finished=True)))
        stream.deliver(("output", output(f"{p}a-1")))
        async with stream:
            n = 0
            async for _ in stream:
                n += 1
                if n == 2:
                    break                              # the handler leaves: the client hung up
        return _data(front.sent)

    async def disconnect():
        front = Front()
        stream = cls(front, [f"{p}d-0"], ["p"], [None], 0)
        handler = asyncio.ensure_future(_drain(stream))
        await asyncio.sleep(0.05)                      # the handler now waits for an output
        stream.abort()                                 # the disconnect watcher, from another task
        await handler
        return _data(front.sent)
    for name, coro in (("failure", failure), ("leave", leave), ("disconnect", disconnect)):
        data[name] = _run(coro)
        if "result" not in data[name]:
            return data
        data[name]["result"] = _data(data[name]["result"])
    made = {}

    async def create():
        made["stream"] = cls(Front(), [f"{p}c-0"], ["p"], [None], 0)
    data["create"] = _run(create)
    if "stream" in made:
        try:
            made["stream"].deliver(("output", output(f"{p}c-0")))
            data["late"] = None
        except Exception as e:            # noqa: BLE001 - judged outside
            data["late"] = error(e)
    return data


def collect_server(cls, seed: int | None = None) -> dict:
    """The real server with the learner's stream: the streamed text, then a client that hangs up."""
    import httpx

    from ..engine.engine import LLMEngine
    from ..server.app import build_app
    from ..server.run import serve_in_thread, stop_server

    model, tok = tiny_model()
    engine = LLMEngine(model, tok, num_kv_blocks=128, max_model_len=1024, block_size=8)
    aborted, abort = [], engine.abort_request
    engine.abort_request = lambda rid: (aborted.append(rid), abort(rid))[1]
    data = {"stage": "start"}
    try:
        app = build_app(engine, "tiny-llama", stream_cls=cls)
        server = serve_in_thread(app)
    except Exception as e:                # noqa: BLE001 - judged outside
        return {**data, "error": error(e)}
    front = app.state.served.front
    try:
        body = {"prompt": prompt_for(seed), "max_tokens": 12, "temperature": 0, "stream": True}
        data["stage"], text = "stream", ""
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
        data["text"] = text
        body = dict(body, max_tokens=600, ignore_eos=True)
        data["stage"] = "hang up"
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            chunks = 0
            for line in r.iter_lines():
                chunks += line.startswith("data: {")
                if chunks == 2:
                    break
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not aborted or front.snapshot.get("num_running")
                                               or front.snapshot.get("kv_blocks_used")):
            time.sleep(0.02)
        data.update(stage="done", aborted=bool(aborted), used=_data(front.snapshot.get("kv_blocks_used")))
    except Exception as e:                # noqa: BLE001 - judged outside
        data["error"] = error(e)
    finally:
        stop_server(server)
    return data


def collect_stream(cls, part: str, seed: int | None = None) -> dict:
    """The collect half: part "unit" or "server" (see the module docstring)."""
    if part == "unit":
        if not inspect.isasyncgenfunction(getattr(cls, "_outputs", None)):
            return {"asyncgen": False}
        return {"asyncgen": True, **collect_unit(cls, seed)}
    return collect_server(cls, seed)
