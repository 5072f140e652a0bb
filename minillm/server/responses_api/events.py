"""A streamed response as the Responses API's events (Server-Sent Events with `event:` lines,
each numbered by `sequence_number`):

    response.created, response.in_progress
    text:  response.output_item.added (message) -> response.content_part.added
           -> response.output_text.delta ... -> response.output_text.done
           -> response.content_part.done -> response.output_item.done
    call:  response.output_item.added (function_call) -> response.function_call_arguments.delta ...
           -> response.function_call_arguments.done -> response.output_item.done
    response.completed (or response.incomplete when max_output_tokens ran out), with the whole response

The chat path's deltas come in (content text, tool_calls pieces: a call with an id opens a new
item, one without carries more of the open call's arguments); OutputEvents turns them into the
events above, and keeps the items for the final response.
"""
from __future__ import annotations

import json

from .convert import new_id
from .protocol import FunctionCallOut, OutputMessage, OutputText


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


class OutputEvents:
    def __init__(self):
        self.items: list = []
        self.open: OutputMessage | FunctionCallOut | None = None
        self.sequence = 0

    def event(self, type_: str, **fields) -> str:
        out = sse({"type": type_, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return out

    def text(self, delta: str):
        if not isinstance(self.open, OutputMessage):
            yield from self.close()
            self.open = OutputMessage(id=new_id("msg"), status="in_progress", content=[OutputText(text="")])
            yield from self.added()
            yield self.event("response.content_part.added", item_id=self.open.id, output_index=self.index,
                             content_index=0, part=OutputText(text="").model_dump())
        self.open.content[0].text += delta
        yield self.event("response.output_text.delta", item_id=self.open.id, output_index=self.index,
                         content_index=0, delta=delta, logprobs=[])

    def call(self, call_id: str | None, name: str | None, arguments: str | None):
        if call_id is not None:                  # a new call
            yield from self.close()
            self.open = FunctionCallOut(id=new_id("fc"), call_id=call_id, name=name or "", arguments="",
                                        status="in_progress")
            yield from self.added()
        if arguments and isinstance(self.open, FunctionCallOut):
            self.open.arguments += arguments
            yield self.event("response.function_call_arguments.delta", item_id=self.open.id,
                             output_index=self.index, delta=arguments)

    @property
    def index(self) -> int:
        return len(self.items)

    def added(self):
        yield self.event("response.output_item.added", output_index=self.index, item=self.open.model_dump())

    def close(self):
        """End the open item (its .done events) and keep it."""
        item, self.open = self.open, None
        if item is None:
            return
        item.status = "completed"
        if isinstance(item, OutputMessage):
            part = item.content[0]
            yield self.event("response.output_text.done", item_id=item.id, output_index=self.index,
                             content_index=0, text=part.text, logprobs=[])
            yield self.event("response.content_part.done", item_id=item.id, output_index=self.index,
                             content_index=0, part=part.model_dump())
        else:
            yield self.event("response.function_call_arguments.done", item_id=item.id, output_index=self.index,
                             name=item.name, arguments=item.arguments)
        yield self.event("response.output_item.done", output_index=self.index, item=item.model_dump())
        self.items.append(item)
