"""Replicas given by URL (`--replica-url URL`, repeatable): `minillm serve` processes someone
else started, on this machine or another, routed to beside the front's own replicas (or alone,
with --data-parallel-size 0).

The front does not own them. It checks them like its own (health.py: out of rotation when
/health fails or is silent, back in when it answers) and routes to them with the same policy
(the prefix tree is kept per replica, whoever started it), but it never starts, signals or
restarts one: whoever started it does. Before the front serves, each must serve the front's
model and adapters: its /v1/models is read once, and a mismatch is an error naming both.

Trust: the front forwards its clients' requests to these URLs as they came, Authorization
header included. Give it only URLs of servers you trust with your clients' prompts and key.
"""
from __future__ import annotations

import httpx

from .replicas import Replica


def replica_url(url: str) -> str:
    """A replica's base URL, checked: http(s)://HOST[:PORT][/prefix]; an OpenAI base URL's
    trailing /v1 is dropped (the front adds the paths it forwards). A ValueError otherwise."""
    text = url.strip().rstrip("/")
    if text.endswith("/v1"):
        text = text[:-3]
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host or parsed.query or parsed.fragment:
        raise ValueError(f"--replica-url {url!r}: must be http://HOST:PORT (or https://) of a running "
                         "`minillm serve`")
    return text


def url_replicas(urls: list[str], first_index: int) -> list[Replica]:
    """Replicas for the URLs, numbered after the front's own; no process, no launcher: never restarted."""
    return [Replica(first_index + k, url) for k, url in enumerate(urls)]


def check_served_models(replicas: list[Replica], model: str, adapters: list[str], api_key: str | None,
                        timeout: float = 10.0) -> None:
    """Each replica given by URL serves `model` (as its base) and every adapter in `adapters`:
    a RuntimeError naming the replica and what differs otherwise."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for r in replicas:
        where = f"{r.describe()}: GET /v1/models"
        try:
            response = httpx.get(r.url + "/v1/models", headers=headers, timeout=timeout)
        except httpx.HTTPError as e:
            raise RuntimeError(f"{where} failed: {e!r}") from None
        if response.status_code == 401:
            raise RuntimeError(f"{where} answered 401: a replica given by URL must accept the key the front's "
                               "clients send (the front forwards their Authorization header; --api-key)")
        try:
            cards = response.json()["data"] if response.status_code == 200 else None
            bases = [c["id"] for c in cards if not c.get("parent")]
            names = {c["id"] for c in cards}
        except (ValueError, KeyError, TypeError, AttributeError):
            cards = None
        if cards is None:
            raise RuntimeError(f"{where} answered {response.status_code}, not a model list: is it a minillm server?")
        if model not in bases:
            raise RuntimeError(f"{where} lists {', '.join(map(repr, bases)) or 'no model'}, not {model!r}: every "
                               "replica must serve the front's model (the front's --model / --served-model-name)")
        missing = [a for a in adapters if a not in names]
        if missing:
            raise RuntimeError(f"{where} does not serve the LoRA adapters {', '.join(map(repr, missing))}: start it "
                               "with the front's --enable-lora --lora-modules")
