"""OpenAI's Responses API (POST /v1/responses) over the chat completions path, as vLLM serves it.

    protocol.py   the request (bounded lists and strings) and the answer, in the openai client's shapes
    convert.py    Responses input items and tools <-> chat messages and tools; chat answers -> output items
    events.py     a streamed answer as the API's events (response.created ... response.completed)
    store.py      stored responses for previous_response_id: bounded, least recently used evicted
    routes.py     the routes
"""
