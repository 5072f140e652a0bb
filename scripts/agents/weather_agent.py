"""An openai-agents SDK agent with one tool, run against `python -m minillm serve` over the
Responses API (the SDK's default model class), once non-streamed and once streamed.

    .venv/bin/python -m minillm serve --port 8000 &
    python -m venv /tmp/agents && /tmp/agents/bin/pip install openai-agents
    /tmp/agents/bin/python scripts/agents/weather_agent.py            # tool_choice "required"
    /tmp/agents/bin/python scripts/agents/weather_agent.py auto       # the model decides

With "required" the first turn must call get_weather (the SDK then sets tool_choice back to
auto, so the second turn answers from the tool's output): the run shows a function_call item,
its function_call_output, and a final message. The embedded 135M model is a weak agent: in
"auto" it may answer in text without calling; the run still completes. Outside the test suite
(it needs the openai-agents package, which the project does not depend on).
"""
import asyncio
import os
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

BASE_URL = os.environ.get("MINILLM_URL", "http://127.0.0.1:8000") + "/v1"
TOOL_CHOICE = sys.argv[1] if len(sys.argv) > 1 else "required"
set_tracing_disabled(True)            # no traces sent to OpenAI's servers


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny, 24 degrees in {city}"


async def main() -> None:
    client = AsyncOpenAI(base_url=BASE_URL, api_key=os.environ.get("MINILLM_API_KEY", "unused"))
    agent = Agent(name="weather", instructions="You answer questions about the weather. Use the get_weather tool.",
                  tools=[get_weather],
                  model=OpenAIResponsesModel(model="SmolLM2-135M-Instruct", openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=300, tool_choice=TOOL_CHOICE))
    ask = "Reply with a <tool_call> to get_weather for Paris."
    for streamed in (False, True):
        if streamed:
            result = Runner.run_streamed(agent, ask)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, ask)
        print("streamed" if streamed else "plain", [type(item).__name__ for item in result.new_items])
        print("  final:", repr(result.final_output)[:120])


if __name__ == "__main__":
    asyncio.run(main())
