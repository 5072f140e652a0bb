"""What the server tells a load balancer and an orchestrator (Kubernetes' probes, vLLM's /health).

    GET /health   readiness, vLLM's endpoint: 200 {"status": "ok"} only while the engine can serve
                  a request now; else 503 with the reason in OpenAI's error shape (a tensor-parallel
                  rank died and the group is restarting: with Retry-After; the engine stopped for
                  good; a multi-node group that lost a node: code "group_failed", with "failed_nodes"
                  and the operator's "action"). A load balancer (or the data-parallel front) routes by it.
    GET /live     liveness: 200 while the server works or heals itself (a restart in progress is
                  alive); 503 once the engine can never serve again. The process then exits
                  non-zero by itself (async_engine.py); a liveness probe catches the moment between
                  (a multi-node group's head stays up, saying why, until its operator restarts it).

A restart counts as alive but not ready, so a Kubernetes liveness probe does not kill a server
that is healing, while its readiness probe takes it out of the Service meanwhile.
Probes come every few seconds: the access log leaves them out (a failure is logged once, at ERROR).
"""
from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from .async_engine import RETRY_AFTER_S, AsyncEngine
from .errors import error_body, error_response
from .openapi import errors
from .responses import Health

PROBES = ("/health", "/live", "/ping")          # /ping: vLLM's alias of /health (vllm_surface.py)


def install_health_routes(app: FastAPI, front: AsyncEngine) -> None:
    @app.get("/health", response_model=Health, responses=errors(503))
    async def health():
        why = front.unavailable()
        if why is None:
            return Health()
        if getattr(front, "lost", None):      # a multi-node group lost a node: which, and what to do next
            body = error_body(503, why, code="group_failed")
            body["error"].update(front.lost)
            return JSONResponse(body, status_code=503)
        retry = None if front.fatal or not front.is_alive else {"Retry-After": str(RETRY_AFTER_S)}
        return error_response(503, why, code="engine_dead" if retry is None else "engine_restarting", headers=retry)

    @app.get("/live", response_model=Health, responses=errors(503))
    async def live():
        if front.fatal or not front.is_alive:
            return error_response(503, front.unavailable() or "the engine loop is not running", code="engine_dead")
        return Health()


class QuietProbes(logging.Filter):
    """Drop uvicorn's access-log line for a probe (its args: client, method, path, version, status):
    a failing engine says why once, at ERROR, not once a probe."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) == 5 and args[2] in PROBES)


def quiet_probes_in_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietProbes) for f in access.filters):
        access.addFilter(QuietProbes())
