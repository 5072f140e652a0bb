"""/health (readiness, vLLM's) and /live (liveness) tell the truth (issue 32; the tensor-parallel
restart is tests/test_tp_restart.py): 200 while the engine serves; when the engine loop dies,
the request in flight ends with a 503, /health and /live answer 503 with the reason, the cause
is logged once at ERROR, and the server is told to stop (the CLI then exits 1)."""
import logging
import time

import httpx

from minillm.engine.engine import LLMEngine
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

from conftest import get_model


class LoopKiller(BaseException):
    """Not an Exception: the engine loop does not survive it (as with a bug in the loop itself)."""


def start():
    model, tokenizer, _ = get_model("tiny-llama")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=32)
    return engine, serve_in_thread(build_app(engine, "tiny-llama"))


def test_a_serving_engine_is_ready_and_alive():
    engine, server = start()
    try:
        for path in ("/health", "/live"):
            r = httpx.get(server.url + path)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
        metrics = httpx.get(server.url + "/metrics").text
        assert "minillm:engine_ready 1.0" in metrics and "minillm:engine_restarts_total 0.0" in metrics
        doc = httpx.get(server.url + "/openapi.json").json()
        assert {"200", "503"} <= set(doc["paths"]["/health"]["get"]["responses"]) \
            and {"200", "503"} <= set(doc["paths"]["/live"]["get"]["responses"])
    finally:
        stop_server(server)


def test_an_engine_loop_that_dies_fails_both_probes_and_stops_the_server(caplog):
    engine, server = start()
    front = server.config.app.state.served.front
    stop, reasons = front.on_fatal, []
    front.on_fatal = reasons.append                      # hold the stop until the probes are read

    def step():
        raise LoopKiller("a bug in the loop")
    engine.step = step
    try:
        with caplog.at_level(logging.ERROR, logger="minillm.server"):
            r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=30)
            assert r.status_code == 503 and "the engine loop died" in r.json()["error"]["message"]
            for path in ("/health", "/live"):
                r = httpx.get(server.url + path)
                assert r.status_code == 503 and "LoopKiller" in r.json()["error"]["message"]
                assert r.json()["error"]["code"] == "engine_dead" and "retry-after" not in r.headers
            r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        assert len(reasons) == 1 and "LoopKiller" in reasons[0]
        logged = [r for r in caplog.records if "cannot be restarted" in r.getMessage()]
        assert len(logged) == 1 and logged[0].levelno == logging.ERROR
        assert "minillm:engine_ready 0.0" in httpx.get(server.url + "/metrics").text
        stop(reasons[0])                                 # what run.py does: the server shuts down
        deadline = time.monotonic() + 30
        while server.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.thread.is_alive()
    finally:
        stop_server(server)
