"""Lesson 07's stream grader, `check_request_stream`: the learner's RequestStream (deliver,
_outputs, abort), the bridge between the engine loop's thread and one HTTP request's
asyncio handler. First alone, on a real event loop (in debug mode, which refuses a
non-thread-safe call from another thread) with a fake engine thread; then plugged into the
real server (`build_app(..., stream_cls=cls)`) on the tiny random Llama: a streamed answer
equals the engine's offline text, and a client that hangs up mid-stream has its request
aborted at once, with every KV block back in the pool. Bugs here hang a handler or leak
blocks rather than fail loudly, so every wait has a timeout that becomes a hint.

The grader has two halves (`course/collect.py`): `lesson07_collect.collect_stream` runs the
scenarios and the server with the learner's class and records what happened, as data (in the
grading sandbox, where the class is; request ids and prompt drawn from the judge's seed);
`judge_request_stream` judges that record here, against the engine's own offline text.
"""
from __future__ import annotations

from .collected import is_error, rebuilt
from .harness import Grader, expect, grader, tiny_model
from .lesson07_collect import collect_stream, ids_for, output, prompt_for

THREAD_SAFE = ("deliver() runs on the engine loop's thread, but an asyncio.Queue belongs to the event "
               "loop's thread and is not thread-safe: hand the item over with "
               "self.loop.call_soon_threadsafe(self.queue.put_nowait, item)")


def _thread_error(e) -> str:
    if isinstance(e, NotImplementedError):
        said = f": {e}" if str(e) not in ("", "YOUR CODE HERE") else ""
        return (f"your stream is not implemented yet (deliver() raised NotImplementedError{said}): fill in the "
                "exercise cell and run it again")
    return f"deliver() raised {type(e).__name__}: {e}. {THREAD_SAFE}"


class _Item:
    """Something the stream yielded that is not one of the delivered outputs: its repr."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def _ran(g, doing, run: dict, hint_on_timeout):
    """A scenario's record (`lesson07_collect._run`): its result; its error, or the hint for its
    hang, raised as the grader's case `doing`."""
    with g.case(doing):
        if is_error(run.get("error")):
            raise rebuilt(run["error"])
        if "result" not in run:
            hint = hint_on_timeout() if callable(hint_on_timeout) else hint_on_timeout
            raise AssertionError(f"{hint} (while {doing})")
        return run["result"]


def _item(record, outs):
    """A yielded item as recorded: ("pair", index, which delivered output) or ("other", repr)."""
    if record[0] == "pair":
        which = record[2]
        return record[1], outs[which] if isinstance(which, int) and 0 <= which < len(outs) else _Item(str(which))
    return _Item(str(record[1]))


def _deliveries(g, run: dict, outs, doing):
    """What the handler got while `outs` were delivered from a thread: (index, output) pairs."""
    errors = [rebuilt(e) for e in run.get("errors", []) if is_error(e)]
    got = [_item(record, outs) for record in run.get("got", [])]

    def stuck():
        if errors:
            return _thread_error(errors[0])
        if not got:
            return f"nothing reached the handler: {THREAD_SAFE}"
        return (f"the iteration never ended, though every request finished (it got {len(got)} of {len(outs)} "
                "outputs): discard a request id from self.unfinished when its output is finished; the loop "
                "`while self.unfinished` then ends")
    _ran(g, doing, run, stuck)
    expect(not errors, _thread_error(errors[0]) if errors else "")
    return got


def _unit(g, data: dict, p: str) -> None:
    outs = [output(f"{p}r-0"), output(f"{p}r-0"), output(f"{p}r-0", finished=True)]
    got = _deliveries(g, data["one"], outs, "iterating one request's stream")
    for item in got:
        expect(isinstance(item, tuple) and len(item) == 2,
               f"the stream yielded {item!r}: yield (prompt index, RequestOutput) pairs")
    expect([o for _, o in got] != outs[:2], "dropped last delta: the last output (finished=True, with the "
                                            "finish reason and the final text) never reached the handler: yield "
                                            "it, then end the iteration")
    expect([o for _, o in got] == outs, f"the stream yielded {len(got)} outputs, not the 3 delivered, in order")
    expect([i for i, _ in got] == [0, 0, 0], f"the stream yielded indices {[i for i, _ in got]} for request {p}r-0, "
                                             "prompt 0: yield self.index[out.request_id], out")
    outs = [output(f"{p}x-0"), output(f"{p}x-1"), output(f"{p}x-0", finished=True), output(f"{p}x-1"),
            output(f"{p}x-1", finished=True)]
    got = _deliveries(g, data["two"], outs, f"iterating a stream of two prompts ({p}x-0, {p}x-1)")
    expect(len(got) >= 3 and got[2][1] is outs[2], f"dropped last delta: {p}x-0's finished output never reached "
                                                   f"the handler: yield it, then drop {p}x-0 from self.unfinished")
    expect(len(got) == 5, f"the stream ended after {len(got)} of 5 outputs, when {p}x-0 finished while {p}x-1 was "
                          "still running: end only when every request of the stream has finished")
    expect([i for i, _ in got] == [0, 1, 0, 1, 1], f"the stream yielded indices {[i for i, _ in got]} for "
                                                   "x-0, x-1, x-0, x-1, x-1: yield self.index[out.request_id]")
    raised = _ran(g, "delivering ('failed', error) to a stream", data["failure"],
                  "after ('failed', error) the handler still waits: raise the error (the engine loop failed, no "
                  "output will come)")
    expect(raised == "the engine loop failed", "after ('failed', RuntimeError(...)) the iteration ended quietly: "
                                               "raise the error, so the handler answers 500 instead of a "
                                               "truncated answer that looks complete")
    sent = _ran(g, "leaving `async with stream` after two outputs (the client hung up)", data["leave"],
                "leaving the stream hangs")
    expect(sent, "blocks leaked on disconnect: leaving the stream (the client hung up) sent no abort, so the "
                 "request keeps generating and its KV blocks stay taken until it ends on its own. abort() must "
                 "send ('abort', [ids still unfinished]) with self.front.send")
    ids = {i for kind, arg in sent if kind == "abort" for i in arg}
    expect(all(kind == "abort" for kind, _ in sent) and f"{p}a-1" in ids and ids <= {f"{p}a-0", f"{p}a-1"},
           f"leaving the stream sent {sent}: expected ('abort', ['{p}a-1']), the requests still unfinished")
    sent = _ran(g, "calling abort() while the handler waits for an output", data["disconnect"],
                "after abort() the handler still waits for outputs that will never come (the engine forgot the "
                "request): wake it up, put ('closed', None) on self.queue and end the iteration on it")
    expect(sent, "blocks leaked on disconnect: abort() sent nothing to the engine; send ('abort', [ids])")
    _ran(g, "creating a stream", data["create"], "creating a stream hangs")
    with g.case("calling deliver() after the event loop closed"):
        if is_error(data.get("late")):
            e = rebuilt(data["late"])
            if isinstance(e, RuntimeError):
                raise AssertionError(f"deliver() raised RuntimeError ({e}) after the event loop had closed (the "
                                     "server is shutting down): nobody listens any more, so catch RuntimeError and "
                                     "drop the item; an exception here would kill the engine loop's thread")
            raise e


def _in_the_server(g, data: dict, seed: int | None) -> None:
    from ..engine.engine import LLMEngine
    from ..sampling_params import SamplingParams

    model, tok = tiny_model()
    expected = LLMEngine(model, tok, num_kv_blocks=128, max_model_len=1024, block_size=8).generate(
        [prompt_for(seed)], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text
    stages = {"start": "building and starting the server with build_app(engine, ..., stream_cls=cls)",
              "stream": "streaming a completion from the server", "hang up": "a client that hangs up after two chunks"}
    for stage, doing in stages.items():
        with g.case(doing):
            if data.get("stage") == stage and is_error(data.get("error")):
                raise rebuilt(data["error"])
        if stage == "stream":
            text = data.get("text")
            expect(text == expected, f"the server streamed {text!r}, the engine offline generates {expected!r}: "
                                     "every output must reach the handler, in order")
    expect(data.get("stage") == "done", f"the server run stopped at {data.get('stage')!r}")
    expect(data.get("aborted") is True, "blocks leaked on disconnect: the client hung up after two chunks of 600, "
                                        "but the engine never got an abort: the request ran on, holding its KV blocks")
    used = data.get("used")
    expect(used == 0, f"{used} KV blocks are still in use after the client hung up and the engine went idle")


def judge_request_stream(collect, seed: int | None = None) -> bool:
    """The judge half (`course/collect.py`): collect(part="unit" | "server", seed=...) is what the
    learner's class did (`lesson07_collect.collect_stream`, in the grading sandbox or here)."""
    g = Grader("check_request_stream", "your stream")
    data = collect(part="unit", seed=seed)
    expect(data.get("asyncgen") is True,
           "_outputs is not an async generator function (an `async def` that `yield`s (index, output) "
           "pairs): it is not implemented yet, or it returns instead of yielding")
    _unit(g, data, ids_for(seed))
    _in_the_server(g, collect(part="server", seed=seed), seed)
    return g.passed()


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
    return judge_request_stream(lambda **inputs: collect_stream(cls, **inputs))
