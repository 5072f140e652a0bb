"""Loading and unloading LoRA adapters while the server runs (vLLM's runtime LoRA updating).

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/adapters/sql"}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

Anyone who can reach these routes can make the server read any folder it can see, so they
exist only when the environment says MINILLM_ALLOW_RUNTIME_LORA_UPDATING=1 (vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING is accepted too); otherwise they are 404, as in vLLM.
A bad folder is a 400 naming the field, and the server goes on serving. Unloading lets the
adapter's requests in flight finish; new requests for its name get a 404.
"""
from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from .openapi import errors

ENV_VARS = ("MINILLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")


def runtime_updating_allowed(environ=os.environ) -> bool:
    return any(environ.get(v, "").strip().lower() in ("1", "true") for v in ENV_VARS)


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None            # vLLM's request has it; the name decides here


def install(app: FastAPI, adapters, environ=os.environ) -> bool:
    """Add the two routes when the environment allows it; True if they were added."""
    if not runtime_updating_allowed(environ):
        return False

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=errors(400, 401))
    async def load_lora_adapter(req: LoadLoRAAdapterRequest):
        lora = await adapters.add(req.lora_name, req.lora_path)
        return f"Success: LoRA adapter '{lora.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=errors(400, 401, 404))
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest):
        lora = adapters.remove(req.lora_name)
        return f"Success: LoRA adapter '{lora.lora_name}' removed successfully."
    return True
