"""The front's routes: one OpenAI endpoint over N replicas.

    POST /v1/completions, /v1/chat/completions   routed (router.py), forwarded (proxy.py)
    GET  /v1/models, /v1/models/{id}              the first replica up answers (adapters included)
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter   to every replica, when allowed (adapters.py)
    GET  /health     readiness: 200 while at least one replica is in rotation, its body saying
                     "ok" (all of them) or "degraded" (fewer: n of N up, which are restarting);
                     503 when none is (Retry-After while one restarts): send no traffic here
    GET  /live       liveness: 200 while the front's event loop runs. The front heals its
                     replicas itself (healing.py) and exits non-zero when it cannot, so an
                     orchestrator restarts the front only when it is wedged or gone
    GET  /metrics                                 every replica's metrics, totals, the router's (metrics.py)
    GET  /replicas                                the router's view: url, pid, state, in flight, routed
                                                  (external: given by URL, never restarted here)

The front does no model work, and the little CPU work it does (parsing a body, hashing a
prompt, merging metrics) runs in worker threads, so its event loop only moves bytes.
The same API key and body limits as a single server apply at the door (guards.py).
"""
from __future__ import annotations

import asyncio
import contextlib

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..errors import install_error_handlers
from ..guards import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, Guards
from . import adapters
from .door import HeaderLimit
from .healing import BACKOFF, MAX_RESTARTS, Healer
from .health import INTERVAL, REPLICA_TIMEOUT, HealthMonitor
from .metrics import RouterMetrics, merge
from .proxy import Proxy
from .router import Router

SCRAPE_TIMEOUT = 5.0
RETRY_AFTER = 5                 # seconds, in a 503 of /health while a replica restarts


def build_front_app(replicas, router: Router, *, api_key: str | None = None,
                    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES, body_timeout: float = DEFAULT_BODY_TIMEOUT,
                    health_interval: float = INTERVAL, replica_timeout: float = REPLICA_TIMEOUT,
                    max_restarts: int = MAX_RESTARTS, restart_backoff: float = BACKOFF, on_all_failed=None,
                    launcher=None) -> FastAPI:
    """An app routing between `replicas` (replicas.Replica, already answering /health).
    Starting and stopping their processes is the caller's business (main.py); restarting one
    that exited is the app's, when the replica has a launcher (healing.py; one given by URL has
    none). `on_all_failed()` runs when every replica has used its `max_restarts`. `launcher`
    remembers the LoRA adapters loaded at runtime, for the replicas it starts again (adapters.py)."""
    metrics = RouterMetrics(router)
    healer = Healer(replicas, metrics, max_restarts, restart_backoff, on_all_failed=on_all_failed)
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=5.0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits) as client:
            state["health"] = health = HealthMonitor(replicas, router, client, health_interval, replica_timeout,
                                                     healer)
            state["proxy"] = Proxy(replicas, router, client, health, metrics)
            monitor = asyncio.create_task(health.run())
            try:
                yield
            finally:
                monitor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor
                state["proxy"].routing_text.close()

    app = FastAPI(title="minillm (data parallel)", lifespan=lifespan, openapi_url=None)
    app.state.router = router
    app.add_middleware(Guards, api_key=api_key, max_body_bytes=max_request_body_bytes, body_timeout=body_timeout)
    app.add_middleware(HeaderLimit)                     # the outermost: before the key is even read
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await state["proxy"].generate(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await state["proxy"].generate(request)

    @app.get("/v1/models")
    async def models(request: Request):
        return await state["proxy"].forward_any(request)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        return await state["proxy"].forward_any(request)

    adapters.install(app, replicas, lambda: state["proxy"].client, launcher)

    @app.get("/health")
    async def health():
        summary = state["health"].summary()
        if summary["replicas_up"]:
            return summary
        headers = {"Retry-After": str(RETRY_AFTER)} if summary["restarting"] else None
        return JSONResponse(summary, status_code=503, headers=headers)

    @app.get("/live")
    async def live():
        return {"status": "alive"}

    @app.get("/metrics")
    async def scrape():
        client = state["proxy"].client

        async def one(i: int):
            try:
                response = await client.get(f"{replicas[i].url}/metrics", timeout=SCRAPE_TIMEOUT)
                return i, response.text if response.status_code == 200 else None
            except httpx.HTTPError:
                return i, None
        texts = {i: text for i, text in await asyncio.gather(*(one(i) for i in range(len(replicas))))
                 if text is not None}
        body = await asyncio.to_thread(lambda: merge(texts) + metrics.render())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/replicas")
    async def replica_states():
        return JSONResponse({"policy": router.policy, "load_bound": router.load_bound, "replicas": [
            {"index": r.index, "url": r.url, "external": r.external, "pid": r.pid, "log": r.log,
             "up": router.up[r.index],
             "state": replica_state(r.index), "restarts": healer.state[r.index].restarts,
             "in_flight": router.in_flight[r.index], "routed": router.routed[r.index]} for r in replicas]})

    def replica_state(i: int) -> str:
        if router.up[i]:
            return "up"
        return "failed" if healer.state[i].failed else "restarting" if healer.restarting(i) else "down"

    return app
