"""A tool call's answer as OpenAI sends it: `message.tool_calls` and finish reason "tool_calls".

Forced calls (a named function, or "required"): the whole answer is the call. Streamed, the
first delta of a named call opens it (id, name) and the following ones carry pieces of its
`arguments`; with "required" the name is inside the answer, so the call is sent whole at the end.

"auto" (tools with tool_choice "auto" or absent): the answer is text, or text then calls in the
model's own format, which the server's tool parser reads (tool_parsers/). Streamed, text goes
out as content until the parser's trigger could be starting (a possible start, and the spaces
before it, are held back);
after the trigger, each call goes out whole (index, id, name, arguments) once it is complete.
An answer whose calls do not parse (max_tokens ran out inside one) is all content.
"""
from __future__ import annotations

import uuid

from .responses import AssistantMessage, Delta, FunctionCallOut, MessageToolCall, ToolCallOut
from .structured import auto_tool_parser, tool_called, tool_calls_from


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    def __init__(self, req):
        self.req = req
        self.active = tool_called(req) is not None
        self.parser = auto_tool_parser(req)
        self.active = self.active or self.parser is not None
        self.opened: set[int] = set()
        self.buffered: dict[int, str] = {}
        self.content_sent: dict[int, int] = {}        # auto: characters of the answer sent as content
        self.calls_sent: dict[int, int] = {}          # auto: calls sent
        self.called: set[int] = set()                 # auto: choices that made a call
        self.last_called = False                      # auto: whether the last message/delta's choice called

    def message(self, text: str) -> AssistantMessage:
        if self.parser is not None:
            content, calls = self.parser.parse(text)
            self.last_called = bool(calls)
            if not calls:
                return AssistantMessage(content=text)
            return AssistantMessage(content=content, tool_calls=[MessageToolCall(
                id=call_id(), type="function", function=FunctionCallOut(name=c.name, arguments=c.arguments))
                for c in calls])
        calls = tool_calls_from(self.req, text) if self.active else None
        if calls is None:
            return AssistantMessage(content=text)
        return AssistantMessage(content=None, tool_calls=[MessageToolCall(**c) for c in calls])

    def finish_reason(self, reason: str | None) -> str | None:
        if self.parser is not None:
            return "tool_calls" if self.last_called and reason == "stop" else reason
        return "tool_calls" if self.active and reason == "stop" else reason

    def delta(self, k: int, text: str, finish: str | None) -> Delta:
        if self.parser is not None:
            return self.auto_delta(k, text, finish)
        if self.req.tool_choice == "required":          # the name is in the answer: send it whole at the end
            self.buffered[k] = self.buffered.get(k, "") + text
            if not finish:
                return Delta()
            calls = tool_calls_from(self.req, self.buffered.pop(k))
            return Delta(tool_calls=[ToolCallOut(index=0, **calls[0])])
        if k not in self.opened:
            self.opened.add(k)
            (call,) = tool_calls_from(self.req, text)
            return Delta(tool_calls=[ToolCallOut(index=0, **call)])
        return Delta(tool_calls=[ToolCallOut(index=0, function=FunctionCallOut(arguments=text))])

    def auto_delta(self, k: int, text: str, finish: str | None) -> Delta:
        answer = self.buffered[k] = self.buffered.get(k, "") + text
        sent, start = self.content_sent.get(k, 0), self.parser.calls_start(answer)
        if start is None:                                # text so far: all but a possible trigger and the
            upto = len(answer) if finish else len(answer) - self.parser.held_back(answer)    # spaces before it
            while not finish and upto > sent and answer[upto - 1].isspace():
                upto -= 1
            calls = []
        elif finish:
            content, calls = self.parser.parse(answer)
            upto = start if calls else len(answer)       # calls that do not parse: the rest is content
        else:
            upto, calls = start, self.parser.finished_calls(answer[start:])
        content = answer[sent:upto] if upto > sent else None
        if calls is not None and start is not None and upto == start and content:
            content = content.rstrip() or None           # the newline before a call is not content
        self.content_sent[k] = max(sent, upto)
        new = calls[self.calls_sent.get(k, 0):]
        if new:
            self.called.add(k)
        out = [ToolCallOut(index=self.calls_sent.get(k, 0) + i, id=call_id(), type="function",
                           function=FunctionCallOut(name=c.name, arguments=c.arguments)) for i, c in enumerate(new)]
        self.calls_sent[k] = self.calls_sent.get(k, 0) + len(new)
        self.last_called = k in self.called
        if finish:
            self.buffered.pop(k, None)
        return Delta(content=content, tool_calls=out or None)
