"""The published OpenAPI schema is what the server does: schemathesis generates requests from
it (valid ones and ones that break it) against the real server on loopback, and every answer
must be documented (status, content type, body schema) and never a 5xx. A bounded number of
examples per route, derandomized (conftest's hypothesis profile), so a run is reproducible."""
import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (content_type_conformance, negative_data_rejection, not_a_server_error,
                                 response_headers_conformance, response_schema_conformance,
                                 status_code_conformance)

from minillm.engine.engine import LLMEngine
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

from conftest import get_model

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance, negative_data_rejection]
KEY = "sk-test"
EXAMPLES = 100           # per route and mode


def start(api_key=None):
    model, tokenizer, _ = get_model("tiny-llama")
    # a short context and few seats: whatever a generated request asks, its work is small
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, max_model_len=48, max_num_seqs=4)
    return serve_in_thread(build_app(engine, "tiny-llama", api_key=api_key))


@pytest.fixture(scope="module")
def server():
    srv = start()
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
ROUTES = [("POST", "/v1/completions", POSITIVE), ("POST", "/v1/completions", NEGATIVE),
          ("POST", "/v1/chat/completions", POSITIVE), ("POST", "/v1/chat/completions", NEGATIVE),
          ("GET", "/v1/models", POSITIVE), ("GET", "/health", POSITIVE), ("GET", "/metrics", POSITIVE)]
# (a GET route takes no input: nothing in it can break the schema)


@pytest.mark.parametrize("method,path,mode", ROUTES)
def test_every_answer_is_documented_and_none_is_a_5xx(api_schema, method, path, mode):
    operation = api_schema[path][method]
    seen = []

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def answer_is_documented(case):
        seen.append(case.call_and_validate(checks=CHECKS).status_code)

    answer_is_documented()
    assert seen and all(status < 500 for status in seen)
    if mode is NEGATIVE:
        assert 400 in seen                     # the negative examples did reach the validation
    elif path != "/v1/chat/completions":       # (a chat message's role rules are beyond the schema)
        assert 200 in seen                     # and some valid ones were served


def test_the_schema_lists_what_the_server_answers(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert set(completions) == {"200", "400", "404", "408", "413", "500", "503"}      # no 422, no 401 without a key
    assert set(completions["200"]["content"]) == {"application/json", "text/event-stream"}
    assert completions["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "HTTPValidationError" not in doc["components"]["schemas"] and "securitySchemes" not in doc["components"]
    r = httpx.get(server.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain") and "minillm:" in r.text
    r = httpx.put(server.url + "/v1/completions", json={})
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_with_a_key_the_schema_declares_it_and_401_is_documented():
    srv = start(api_key=KEY)
    try:
        doc = httpx.get(srv.url + "/openapi.json").json()
        assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/models"):
            operation = next(iter(doc["paths"][path].values()))
            assert operation["security"] == [{"bearer": []}] and "401" in operation["responses"]
        assert "security" not in doc["paths"]["/health"]["get"]
        r = httpx.get(srv.url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    finally:
        stop_server(srv)
