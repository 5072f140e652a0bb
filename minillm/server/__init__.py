"""An OpenAI-compatible HTTP server over the engine (lesson 07).

    protocol.py      the OpenAI requests and responses (pydantic)
    async_engine.py  one thread owns the engine; asyncio handlers talk to it by queues
    serving.py       request -> engine requests; outputs -> choices and text deltas
    app.py           the routes (FastAPI), streaming as Server-Sent Events
    errors.py        OpenAI-shaped errors; guards.py  API key and body-size checks
    health.py        /health (readiness) and /live (liveness); body_parsing.py  big bodies off the loop
    metrics.py       Prometheus metrics;   run.py / cli.py  uvicorn, `python -m minillm serve`

Needs the `serve` extra (fastapi, uvicorn, prometheus_client). This package file imports
nothing, so `python -m minillm generate` works without that extra:

    from minillm.server.app import build_app
    from minillm.server.run import serve_in_thread, stop_server
"""
