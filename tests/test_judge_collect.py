"""Graders split in a collect half and a judge half (minillm/course/collect.py, issue 31): lesson
10's layer sharding, lesson 08's Triton kernel and lesson 07's request stream run in the grading
sandbox on the student's object (inputs drawn from the judge's seed) and are judged outside it.

First the mechanism alone, over a real channel (two `Peer`s on pipes, the sandbox's side in a
thread): an honest shard function passes with a seed the notebook never uses, a planted mistake
gets the grader's own hint, a reply holding an object of the sandbox (not data) is refused, and a
learner's exception comes back with its type's name, message and cause. Then in the sandbox
(bubblewrap; skipped, with the reason, where it cannot run), one exercise cell at a time through
the judge: the package's answer called from a thread (withheld in the sandbox's package) and a
`gc` sweep that swaps the code of every grader, collect and judge function it finds (which passed
when the verdict was decided inside) get nothing; so does lesson 07's stream whose deliver and
abort hand the work to the package's own in a thread. The honest and planted students of these
lessons are graded in the sandbox by tests/test_grade.py (and lesson 10's by test_grade_sandbox.py).
"""
import os
import threading

import pytest
import torch

from minillm.checks.collected import error, rebuilt
from minillm.course import wire
from minillm.course.collect import judge_collected, plain
from minillm.course.proxy import Peer
from minillm.course.serve import answer
from minillm.distributed.sharding import shard_decoder_layer


def no_all_reduce_in_the_mlp(layer, rank, n, group):
    shard_decoder_layer(layer, rank, n, group)
    layer.mlp.down_proj = layer.mlp.down_proj.linear           # the row-parallel shard without its all-reduce


@pytest.fixture
def channel():
    """(the judge's Peer, the namespace the sandbox's side serves): the sandbox's side in a thread."""
    to_side, from_judge = os.pipe()
    to_judge, from_side = os.pipe()
    ns = {}
    judge = Peer(os.fdopen(to_judge, "rb"), os.fdopen(from_judge, "wb"), share_containers=True)
    side = Peer(os.fdopen(to_side, "rb"), os.fdopen(from_side, "wb"), extra=lambda r: answer(r, ns, {}))

    def serve():
        while (request := wire.receive(side.inp))[0].get("op") != "bye":
            side.serve(*request)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield judge, ns
    wire.send(judge.out, {"op": "bye"}, [])
    thread.join(10)


CHECK = {"exercise": "layer_sharding", "grader": "check_layer_sharding", "args": ["shard_decoder_layer"]}


def test_the_judge_half_judges_what_the_sandbox_collected(channel):
    judge, ns = channel
    ns["shard_decoder_layer"] = shard_decoder_layer
    judge_collected(CHECK, judge.ask)                              # a seed drawn now: passes all the same
    ns["shard_decoder_layer"] = no_all_reduce_in_the_mlp
    with pytest.raises(AssertionError, match=r"(?s)MLP half .* did no all-reduce.*down_proj output is a partial sum"):
        judge_collected(CHECK, judge.ask)
    ns["shard_decoder_layer"] = lambda layer, rank, n, group: {}["no such key"]
    with pytest.raises(AssertionError, match=r"your shard_decoder_layer raised KeyError: 'no such key'\n    while "
                                             r"calling shard_decoder_layer\(layer, rank=0"):
        judge_collected(CHECK, judge.ask)


def test_a_reply_that_is_not_data_is_refused(channel):
    judge, ns = channel
    ns["thing"] = threading.Lock()
    handle = judge.ask({"op": "get", "name": "thing"})
    assert plain({"out": [torch.zeros(2), 1, "x"]})["out"][1] == 1
    with pytest.raises(AssertionError, match="collect half, in the sandbox, was replaced.*not data"):
        plain({"calls": [None, handle]})


def test_an_exception_as_data_and_back():
    try:
        try:
            {}["k"]
        except KeyError as e:
            raise NotImplementedError("mine: withheld while grading") from e
    except NotImplementedError as e:
        data = error(e)
    back = rebuilt(wire.decode(wire.encode(data, []), []))
    assert isinstance(back, NotImplementedError) and type(back).__name__ == "NotImplementedError"
    assert str(back) == "mine: withheld while grading"
    assert isinstance(back.__cause__, KeyError) and str(back.__cause__) == "'k'"
    odd = rebuilt({"raised": "InterpreterError", "message": "in the kernel", "cause": None})
    assert type(odd).__name__ == "InterpreterError" and str(odd) == "in the kernel" and isinstance(odd, Exception)
    assert isinstance(rebuilt({"raised": "BrokenBarrierError", "message": ""}), threading.BrokenBarrierError)


# ---------------------------------------------------------------- in the sandbox, through the judge

THREAD_SHARD = '''from concurrent.futures import ThreadPoolExecutor
from minillm.distributed import sharding as _pkg


def shard_decoder_layer(layer, rank, n, group):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_pkg.shard_decoder_layer, layer, rank, n, group).result()
'''
GC_SWAP = '''import types
import minillm.checks
_gc = __import__("g" + "c")
for _o in _gc.get_objects():
    if isinstance(_o, types.FunctionType) and _o.__name__.startswith(("check_", "collect_", "judge_")):
        try:
            setattr(_o, "__co" + "de__", getattr(lambda *a, **k: True, "__co" + "de__"))
        except (ValueError, TypeError):
            pass


'''
THREAD_STREAM = '''from concurrent.futures import ThreadPoolExecutor
_pool = ThreadPoolExecutor(1)


class MyStream(RequestStream):
    def deliver(self, item) -> None:
        return _pool.submit(RequestStream.deliver, self, item).result()

    async def _outputs(self):
        while self.unfinished:
            kind, value = await self.queue.get()
            if kind == "closed":
                return
            if kind == "failed":
                raise value
            if value.finished:
                self.unfinished.discard(value.request_id)
            yield self.index[value.request_id], value

    def abort(self) -> None:
        return _pool.submit(RequestStream.abort, self).result()
'''
SHARD_CELL, KERNEL_CELL, STREAM_CELL = "t10-11", "a8c00010", "a7c10021"


def judged(number: str, cell_id: str, exercise: str, source=None, prefix: str = "") -> tuple[bool, str]:
    """The judge's verdict on `exercise` of lesson `number` with the exercise cell `cell_id` replaced by
    `source` (None: the solution's), `prefix` put before it; graded in the sandbox, alone."""
    from grading_class import LESSONS, REPO

    from minillm.course import sandbox
    from minillm.course.build import make_lesson, read, strip_markers
    from minillm.course.isolate import finish_verdicts, plan, start_verdicts, student_cells
    problem = sandbox.probe()
    if problem:
        pytest.skip(f"no sandbox on this machine: {problem}")
    name = LESSONS[number]
    solution = read(REPO / "solutions" / name)
    lesson = make_lesson(solution, "solutions/" + name)
    the_plan = plan(lesson)                                        # from the course's cells, stubs and all
    if source is None:
        source = strip_markers(next(c.source for c in solution.cells if c.get("id") == cell_id))
    next(c for c in lesson.cells if c.get("id") == cell_id).source = prefix + source
    checks = [c for c in the_plan.checks if c.exercise == exercise]
    code = [c for c in lesson.cells if c.cell_type == "code"]
    kind = sandbox._state["kind"]
    sandbox.use("bwrap")
    try:
        verdicts, why = finish_verdicts(*start_verdicts(the_plan, student_cells(the_plan, code), None, checks), 300)
    finally:
        sandbox.use(kind)
    assert why is None, why
    return verdicts[exercise]


def stub(number: str, cell_id: str) -> str:
    from grading_class import lesson
    return next(c.source for c in lesson(number).cells if c.get("id") == cell_id)


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["thread", "gc"])
def test_layer_sharding_judged_outside(attack):
    """(the honest lesson 10 passes in the sandbox in tests/test_grade_sandbox.py and tests/test_grade.py)"""
    source, prefix = {"thread": (THREAD_SHARD, ""), "gc": (stub("10", SHARD_CELL), GC_SWAP)}[attack]
    passed, message = judged("10", SHARD_CELL, "layer_sharding", source, prefix)
    assert not passed, message
    if attack == "gc":                                             # inside, with verdict.py, it passed
        assert "collect half, in the sandbox, was replaced" in message, message
    if attack == "thread":
        assert "calls the package's answer minillm.distributed.sharding.shard_decoder_layer" in message, message


@pytest.mark.slow
def test_paged_decode_kernel_judged_outside():
    """The gc sweep on lesson 08 (its honest kernel passes in the sandbox in tests/test_grade.py)."""
    pytest.importorskip("triton")
    passed, message = judged("08", KERNEL_CELL, "paged_decode_kernel", stub("08", KERNEL_CELL), GC_SWAP)
    assert not passed and "collect half, in the sandbox, was replaced" in message, message


@pytest.mark.slow
def test_request_stream_judged_outside():
    """Lesson 07's stream whose deliver and abort run the package's own in a thread: withheld there."""
    passed, message = judged("07", STREAM_CELL, "request_stream", THREAD_STREAM)
    assert not passed and "calls the package's answer minillm.server.async_engine.RequestStream.deliver" in message, \
        message
