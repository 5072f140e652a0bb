"""A forced tool call's answer as OpenAI sends it: `message.tool_calls` (content null) and
finish reason "tool_calls"; streamed, the first delta of a choice opens the call (id, name)
and the following ones carry pieces of its `arguments` text. With tool_choice "required"
the function's name is inside the answer, so the call is sent whole when the choice ends.
"""
from __future__ import annotations

from .responses import AssistantMessage, Delta, FunctionCallOut, ToolCallOut
from .structured import tool_called, tool_calls_from


class ToolCallStream:
    def __init__(self, req):
        self.req = req
        self.active = tool_called(req) is not None
        self.opened: set[int] = set()
        self.buffered: dict[int, str] = {}

    def message(self, text: str) -> AssistantMessage:
        calls = tool_calls_from(self.req, text) if self.active else None
        if calls is None:
            return AssistantMessage(content=text)
        return AssistantMessage(content=None, tool_calls=[ToolCallOut(**c) for c in calls])

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.active and reason == "stop" else reason

    def delta(self, k: int, text: str, finish: str | None) -> Delta:
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
