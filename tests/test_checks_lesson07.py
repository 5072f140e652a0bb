"""Tests of the graders of lesson 07 (minillm.checks.lesson07_detokenizer, lesson07_stream).

The reference passes each one, and planted mistakes — the ones learners actually make — are
rejected with a hint that names the problem. Addressable per lesson task:
`pytest -k check_detokenizer`, `pytest -k check_request_stream`.
"""
import pytest
from checks_support import rejects

from minillm import checks
from minillm.text.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minillm.server.async_engine import RequestStream


# ---------------------------------------------------------------- lesson 07: detokenizer

class SingleTokenDecode(IncrementalDetokenizer):
    """Decodes each token alone: a character split over byte tokens comes out as U+FFFD."""
    def add(self, token_id):
        self.token_ids.append(token_id)
        delta = self.tokenizer.decode([token_id])
        self.text += delta
        return delta


class EmitsUnfinishedCharacters(IncrementalDetokenizer):
    """The window scheme, but a delta ending in U+FFFD is sent instead of held back."""
    def add(self, token_id):
        self.token_ids.append(token_id)
        window = self.token_ids[self.prefix_offset:]
        prefix_text = self.tokenizer.decode(window[:self.read_offset - self.prefix_offset])
        delta = self.tokenizer.decode(window)[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += delta
        return delta


class FlushDropsTheTail(IncrementalDetokenizer):
    def flush(self):
        self.pending = ""
        self.prefix_offset = self.read_offset = len(self.token_ids)
        return ""


class DecodesEverythingEveryToken(IncrementalDetokenizer):
    """Right text, O(n²) work: the whole output is decoded at every token."""
    def add(self, token_id):
        self.token_ids.append(token_id)
        delta = self.tokenizer.decode(self.token_ids)[len(self.text):]
        if delta.endswith(REPLACEMENT_CHAR):
            self.pending = delta
            return ""
        self.pending = ""
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta


class NoPending(IncrementalDetokenizer):
    """Holds unfinished characters back but never records them in self.pending."""
    def add(self, token_id):
        delta = super().add(token_id)
        self.pending = ""
        return delta

    def flush(self):
        return ""


class ForgetsText(IncrementalDetokenizer):
    def add(self, token_id):
        delta = super().add(token_id)
        self.text = ""
        return delta


class NeverMovesTheWindow(IncrementalDetokenizer):
    """Forgets to move prefix_offset / read_offset after a delta: text repeats."""
    def add(self, token_id):
        self.token_ids.append(token_id)
        delta = self.tokenizer.decode(self.token_ids[self.prefix_offset:])
        if not delta or delta.endswith(REPLACEMENT_CHAR):
            self.pending = delta
            return ""
        self.pending = ""
        self.text += delta
        return delta


class NoHoldBack(IncrementalDetokenizer):
    def settled_text(self, stop):
        return self.text


class HoldsOnlyTheLongestPrefix(IncrementalDetokenizer):
    """Checks only whether the text ends with stop[:-1]: 'abc E' leaks the 'E' of 'END'."""
    def settled_text(self, stop):
        for s in stop:
            if len(s) > 1 and self.text.endswith(s[:-1]):
                return self.text[:-(len(s) - 1)]
        return self.text


class FixedBuffer(IncrementalDetokenizer):
    """Always holds len(stop) - 1 characters back, even a false start like 'ENx'."""
    def settled_text(self, stop):
        n = max((len(s) - 1 for s in stop), default=0)
        return self.text[:len(self.text) - n]


class CutsTextInPlace(IncrementalDetokenizer):
    def settled_text(self, stop):
        self.text = super().settled_text(stop)
        return self.text


def test_check_detokenizer_accepts_the_reference():
    assert checks.check_detokenizer(IncrementalDetokenizer)


@pytest.mark.parametrize("bad, match", [
    (SingleTokenDecode, "broken UTF-8"),
    (EmitsUnfinishedCharacters, "broken UTF-8"),
    (FlushDropsTheTail, "dropped last delta"),
    (DecodesEverythingEveryToken, "O\\(n²\\)"),
    (NoPending, "self.pending is ''"),
    (ForgetsText, "self.text must be every delta"),
    (NeverMovesTheWindow, "Text is repeated"),
    (NoHoldBack, "stop string leaked"),
    (HoldsOnlyTheLongestPrefix, "stop string leaked"),
    (FixedBuffer, "hold back only a tail that is a beginning of a stop string"),
    (CutsTextInPlace, "changed self.text"),
], ids=lambda x: x.__name__ if isinstance(x, type) else "")
def test_check_detokenizer_rejects(bad, match):
    rejects(checks.check_detokenizer, bad, match)


# ---------------------------------------------------------------- lesson 07: request stream

class NotThreadSafe(RequestStream):
    def deliver(self, item):
        self.queue.put_nowait(item)          # from the engine's thread, straight into an asyncio.Queue


class DropsTheLastOutput(RequestStream):
    async def _outputs(self):
        while self.unfinished:
            kind, value = await self.queue.get()
            if kind == "closed":
                return
            if kind == "failed":
                raise value
            if value.finished:
                self.unfinished.discard(value.request_id)
                continue                     # "it's done": but its output carries the end of the text
            yield self.index[value.request_id], value


class NeverEnds(RequestStream):
    async def _outputs(self):
        while self.unfinished:
            kind, value = await self.queue.get()
            if kind == "closed":
                return
            if kind == "failed":
                raise value
            yield self.index[value.request_id], value


class EndsAtTheFirstFinish(RequestStream):
    async def _outputs(self):
        while True:
            kind, value = await self.queue.get()
            if kind == "closed":
                return
            if kind == "failed":
                raise value
            yield self.index[value.request_id], value
            if value.finished:
                return


class YieldsRequestIds(RequestStream):
    async def _outputs(self):
        async for _, value in super()._outputs():
            yield value.request_id, value


class SwallowsFailures(RequestStream):
    async def _outputs(self):
        while self.unfinished:
            kind, value = await self.queue.get()
            if kind in ("closed", "failed"):
                return
            if value.finished:
                self.unfinished.discard(value.request_id)
            yield self.index[value.request_id], value


class AbortNeverSent(RequestStream):
    def abort(self):
        if self.unfinished:
            self.unfinished.clear()
            self.queue.put_nowait(("closed", None))


class AbortDoesNotWake(RequestStream):
    def abort(self):
        if self.unfinished:
            self.front.send(("abort", list(self.unfinished)))
            self.unfinished.clear()


class DeliverAfterCloseRaises(RequestStream):
    def deliver(self, item):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def test_check_request_stream_accepts_the_reference():
    assert checks.check_request_stream(RequestStream)


@pytest.mark.parametrize("bad, match", [
    (NotThreadSafe, "not thread-safe"),
    (DropsTheLastOutput, "dropped last delta"),
    (NeverEnds, "the iteration never ended"),
    (EndsAtTheFirstFinish, "end only when every request of the stream has finished"),
    (YieldsRequestIds, "yield self.index\\[out.request_id\\]"),
    (SwallowsFailures, "raise the error"),
    (AbortNeverSent, "blocks leaked on disconnect"),
    (AbortDoesNotWake, "put \\('closed', None\\)"),
    (DeliverAfterCloseRaises, "after the event loop had closed"),
], ids=lambda x: x.__name__ if isinstance(x, type) else "")
def test_check_request_stream_rejects(bad, match):
    rejects(checks.check_request_stream, bad, match)
