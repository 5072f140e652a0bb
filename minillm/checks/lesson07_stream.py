"""Lesson 07's stream grader, `check_request_stream`: the learner's RequestStream (deliver,
_outputs, abort), the bridge between the engine loop's thread and one HTTP request's
asyncio handler. First alone, on a real event loop (in debug mode, which refuses a
non-thread-safe call from another thread) with a fake engine thread; then plugged into the
real server (`build_app(..., stream_cls=cls)`) on the tiny random Llama: a streamed answer
equals the engine's offline text, and a client that hangs up mid-stream has its request
aborted at once, with every KV block back in the pool. Bugs here hang a handler or leak
blocks rather than fail loudly, so every wait has a timeout that becomes a hint.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from types import SimpleNamespace

from .harness import Grader, expect, grader, tiny_model

TIMEOUT = 5.0
THREAD_SAFE = ("deliver() runs on the engine loop's thread, but an asyncio.Queue belongs to the event "
               "loop's thread and is not thread-safe: hand the item over with "
               "self.loop.call_soon_threadsafe(self.queue.put_nowait, item)")


class _Front:
    """Stands in for the AsyncEngine: records the commands a stream sends it."""

    def __init__(self):
        self.sent = []

    def send(self, command):
        self.sent.append(command)


def _thread_error(e) -> str:
    if isinstance(e, NotImplementedError):
        return ("your stream is not implemented yet (deliver() raised NotImplementedError): fill in the "
                "exercise cell and run it again")
    return f"deliver() raised {type(e).__name__}: {e}. {THREAD_SAFE}"


def _out(rid, finished=False):
    return SimpleNamespace(request_id=rid, finished=finished, outputs=[])


def _run(g, doing, coro_fn, hint_on_timeout, give_up=lambda: False):
    """Run coro_fn() on a fresh event loop in debug mode, in a thread of its own (a notebook's
    thread already runs one); a hang becomes the hint (a str, or a function giving one), and
    `give_up()` true ends the wait early. A hung task is cancelled; one that cannot even be
    cancelled (a wakeup lost to a non-thread-safe call never comes) has its coroutine closed."""
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
        except BaseException as e:        # noqa: BLE001 - raised again in the grader's thread
            box["error"] = e
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
    with g.case(doing):
        if "error" in box:
            raise box["error"]
        if "result" not in box:
            hint = hint_on_timeout() if callable(hint_on_timeout) else hint_on_timeout
            raise AssertionError(f"{hint} (while {doing})")
        return box["result"]



def _engine_thread(stream, items, errors):
    """Deliver items from another thread, as the engine loop does, after the handler waits."""
    def run():
        try:
            for item in items:
                time.sleep(0.01)
                stream.deliver(item)
        except Exception as e:            # noqa: BLE001 - reported by the grader
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _deliveries(g, cls, ids, outs, doing):
    """Items delivered from a thread while the handler iterates: what it got, and errors."""
    got, errors = [], []

    async def handler():
        stream = cls(_Front(), ids, ["p"] * len(ids), [None] * len(ids), 0)
        await asyncio.sleep(0.05)                      # ...so that the handler waits when items arrive
        _engine_thread(stream, [("output", o) for o in outs], errors)
        async for item in stream:
            got.append(item)

    def stuck():
        if errors:
            return _thread_error(errors[0])
        if not got:
            return f"nothing reached the handler: {THREAD_SAFE}"
        return (f"the iteration never ended, though every request finished (it got {len(got)} of {len(outs)} "
                "outputs): discard a request id from self.unfinished when its output is finished; the loop "
                "`while self.unfinished` then ends")
    _run(g, doing, handler, stuck, give_up=lambda: bool(errors))
    expect(not errors, _thread_error(errors[0]) if errors else "")
    return got


def _unit(g, cls) -> None:
    outs = [_out("r-0"), _out("r-0"), _out("r-0", finished=True)]
    got = _deliveries(g, cls, ["r-0"], outs, "iterating one request's stream")
    for item in got:
        expect(isinstance(item, tuple) and len(item) == 2,
               f"the stream yielded {item!r}: yield (prompt index, RequestOutput) pairs")
    expect([o for _, o in got] != outs[:2], "dropped last delta: the last output (finished=True, with the "
                                            "finish reason and the final text) never reached the handler: yield "
                                            "it, then end the iteration")
    expect([o for _, o in got] == outs, f"the stream yielded {len(got)} outputs, not the 3 delivered, in order")
    expect([i for i, _ in got] == [0, 0, 0], f"the stream yielded indices {[i for i, _ in got]} for request r-0, "
                                             "prompt 0: yield self.index[out.request_id], out")
    outs = [_out("x-0"), _out("x-1"), _out("x-0", finished=True), _out("x-1"), _out("x-1", finished=True)]
    got = _deliveries(g, cls, ["x-0", "x-1"], outs, "iterating a stream of two prompts (x-0, x-1)")
    expect(len(got) >= 3 and got[2][1] is outs[2], "dropped last delta: x-0's finished output never reached "
                                                   "the handler: yield it, then drop x-0 from self.unfinished")
    expect(len(got) == 5, f"the stream ended after {len(got)} of 5 outputs, when x-0 finished while x-1 was "
                          "still running: end only when every request of the stream has finished")
    expect([i for i, _ in got] == [0, 1, 0, 1, 1], f"the stream yielded indices {[i for i, _ in got]} for "
                                                   "x-0, x-1, x-0, x-1, x-1: yield self.index[out.request_id]")

    async def failure():
        stream = cls(_Front(), ["f-0"], ["p"], [None], 0)
        stream.deliver(("output", _out("f-0")))
        stream.deliver(("failed", RuntimeError("the engine loop failed")))
        try:
            async for _ in stream:
                pass
        except RuntimeError as e:
            return str(e)
        return None
    raised = _run(g, "delivering ('failed', error) to a stream", failure,
                  "after ('failed', error) the handler still waits: raise the error (the engine loop failed, no "
                  "output will come)")
    expect(raised == "the engine loop failed", "after ('failed', RuntimeError(...)) the iteration ended quietly: "
                                               "raise the error, so the handler answers 500 instead of a "
                                               "truncated answer that looks complete")

    async def leave():
        front = _Front()
        stream = cls(front, ["a-0", "a-1"], ["p", "p"], [None, None], 0)
        stream.deliver(("output", _out("a-0", finished=True)))
        stream.deliver(("output", _out("a-1")))
        async with stream:
            n = 0
            async for _ in stream:
                n += 1
                if n == 2:
                    break                              # the handler leaves: the client hung up
        return front.sent
    sent = _run(g, "leaving `async with stream` after two outputs (the client hung up)", leave,
                "leaving the stream hangs")
    expect(sent, "blocks leaked on disconnect: leaving the stream (the client hung up) sent no abort, so the "
                 "request keeps generating and its KV blocks stay taken until it ends on its own. abort() must "
                 "send ('abort', [ids still unfinished]) with self.front.send")
    ids = {i for kind, arg in sent if kind == "abort" for i in arg}
    expect(all(kind == "abort" for kind, _ in sent) and "a-1" in ids and ids <= {"a-0", "a-1"},
           f"leaving the stream sent {sent}: expected ('abort', ['a-1']), the requests still unfinished")

    async def disconnect():
        front = _Front()
        stream = cls(front, ["d-0"], ["p"], [None], 0)
        handler = asyncio.ensure_future(_drain(stream))
        await asyncio.sleep(0.05)                      # the handler now waits for an output
        stream.abort()                                 # the disconnect watcher, from another task
        await handler
        return front.sent
    sent = _run(g, "calling abort() while the handler waits for an output", disconnect,
                "after abort() the handler still waits for outputs that will never come (the engine forgot the "
                "request): wake it up, put ('closed', None) on self.queue and end the iteration on it")
    expect(sent, "blocks leaked on disconnect: abort() sent nothing to the engine; send ('abort', [ids])")

    async def closed_later():
        return cls(_Front(), ["c-0"], ["p"], [None], 0)
    stream = _run(g, "creating a stream", closed_later, "creating a stream hangs")
    with g.case("calling deliver() after the event loop closed"):
        try:
            stream.deliver(("output", _out("c-0")))
        except RuntimeError as e:
            raise AssertionError(f"deliver() raised RuntimeError ({e}) after the event loop had closed (the "
                                 "server is shutting down): nobody listens any more, so catch RuntimeError and "
                                 "drop the item; an exception here would kill the engine loop's thread") from None


async def _drain(stream):
    async for _ in stream:
        pass


def _in_the_server(g, cls) -> None:
    import httpx

    from ..engine.engine import LLMEngine
    from ..sampling_params import SamplingParams
    from ..server.app import build_app
    from ..server.run import serve_in_thread, stop_server

    model, tok = tiny_model()
    options = dict(num_kv_blocks=128, max_model_len=1024, block_size=8)
    expected = LLMEngine(model, tok, **options).generate(["The capital of France is"], SamplingParams(
        temperature=0, max_tokens=12))[0].outputs[0].text
    engine = LLMEngine(model, tok, **options)
    aborted, abort = [], engine.abort_request
    engine.abort_request = lambda rid: (aborted.append(rid), abort(rid))[1]
    with g.case("building and starting the server with build_app(engine, ..., stream_cls=cls)"):
        app = build_app(engine, "tiny-llama", stream_cls=cls)
        server = serve_in_thread(app)
    front = app.state.served.front
    try:
        body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "stream": True}
        with g.case("streaming a completion from the server"):
            text = ""
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
        expect(text == expected, f"the server streamed {text!r}, the engine offline generates {expected!r}: "
                                 "every output must reach the handler, in order")
        body = dict(body, max_tokens=600, ignore_eos=True)
        with g.case("a client that hangs up after two chunks"):
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
        expect(aborted, "blocks leaked on disconnect: the client hung up after two chunks of 600, but the engine "
                        "never got an abort: the request ran on, holding its KV blocks")
        used = front.snapshot.get("kv_blocks_used")
        expect(used == 0, f"{used} KV blocks are still in use after the client hung up and the engine went idle")
    finally:
        stop_server(server)


@grader
def check_request_stream(cls) -> bool:
    """cls(front, request_ids, prompts, params, priority), like `server.async_engine.RequestStream`
    (a subclass of it is simplest): deliver(item) is called from the engine loop's thread and
    hands ("output", out) / ("failed", error) items to self.queue thread-safely; `async for`
    yields (prompt index, output) until every request finished, the finished outputs
    included, and raises a failure; abort() sends ("abort", [unfinished ids]) to the front
    and wakes a waiting iteration, which then ends; leaving `async with` aborts.

    Then the real server with `build_app(..., stream_cls=cls)` streams the engine's offline
    text, and a client hanging up mid-stream gets its request aborted, all KV blocks freed.
    """
    g = Grader("check_request_stream", "your stream")
    expect(inspect.isasyncgenfunction(cls._outputs),
           "_outputs is not an async generator function (an `async def` that `yield`s (index, output) "
           "pairs): it is not implemented yet, or it returns instead of yielding")
    _unit(g, cls)
    _in_the_server(g, cls)
    return g.passed()
