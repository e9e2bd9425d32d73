"""The router's own HTTP surface as an OpenAPI 3.1 document, served at ``/openapi.json``.

Why a hand-written table rather than a walk of the app's routes: the document says what a
walk cannot (how each route is keyed, how it fails over, which errors it answers), and a
test (tests/router/test_openapi.py) holds the table and the app's router to the same set
of (method, path), so neither can drift. Request bodies are the engines' (vLLM's, OpenAI's)
and pass through unchanged; the document names the fields the router itself reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router.server.passthrough import PASS_THROUGH

ERROR = {"$ref": "#/components/responses/Error"}


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    tag: str
    keyed: str = ""  # how a routed request is keyed ("" for the router's own routes)
    failover: str = ""
    reads: tuple[str, ...] = ()  # body fields the router reads (the rest pass through)
    errors: tuple[int, ...] = (400, 404, 413, 502, 503, 504)


_PINNED = ("only the worker that made the response; none when it is gone (404 "
           "response_worker_gone)")
_RANKED = ("the next ranked worker before the first byte; after it a broken stream resumes "
           "on another worker (chat, completions) or ends with an SSE error event")
_LEAST = "next least-loaded worker before the first byte"
_PASS = "not keyed: the least-loaded worker serving the model"
_ADMIN = (401, 404)

OPERATIONS: tuple[Operation, ...] = (
    Operation("POST", "/v1/chat/completions", "Chat completion, streamed or not", "routed",
              "tools, then every message's role and content", _RANKED,
              ("model", "messages", "tools", "stream", "cache_salt")),
    Operation("POST", "/v1/completions", "Completion, streamed or not", "routed",
              "prompt (text or token ids)", _RANKED, ("model", "prompt", "stream", "cache_salt")),
    Operation("POST", "/v1/responses", "Responses API: create (a follow-up with "
              "previous_response_id goes to the maker)", "routed",
              "instructions, then input, as a chat; previous_response_id pins it", _RANKED,
              ("model", "instructions", "input", "previous_response_id", "stream",
               "cache_salt")),
    Operation("GET", "/v1/responses/{response_id}", "Responses API: retrieve", "routed",
              "the response id", _PINNED, errors=(404, 502, 504)),
    Operation("POST", "/v1/responses/{response_id}/cancel", "Responses API: cancel", "routed",
              "the response id", _PINNED, errors=(404, 502, 504)),
    Operation("POST", "/v1/messages", "Anthropic Messages, streamed or not", "routed",
              "system, then messages, as a chat", _RANKED,
              ("model", "system", "messages", "stream", "cache_salt")),
    Operation("POST", "/v1/embeddings", "Embeddings", "pass-through", _PASS, _LEAST,
              ("model",)),
    *(Operation("POST", path, f"vLLM {path.rsplit('/', 1)[-1]}", "pass-through", _PASS,
                _LEAST, ("model",)) for path in PASS_THROUGH),
    Operation("GET", "/v1/models", "The union of the workers' models (LoRA adapters with "
              "their parent)", "router", errors=()),
    Operation("GET", "/health", "Liveness: 200 while the process serves", "router",
              errors=()),
    Operation("GET", "/ready", "Readiness: 200 once a worker is healthy, else 503", "router",
              errors=(503,)),
    Operation("GET", "/metrics", "Prometheus metrics", "router", errors=()),
    Operation("GET", "/openapi.json", "This document", "router", errors=()),
    Operation("GET", "/admin/workers", "List the workers", "admin", errors=_ADMIN),
    Operation("POST", "/admin/workers", "Add a worker {url, id?, models?}", "admin",
              reads=("url", "id", "models"), errors=(400, *_ADMIN)),
    Operation("DELETE", "/admin/workers/{worker_id}", "Remove a worker", "admin",
              errors=_ADMIN),
    Operation("POST", "/admin/workers/{worker_id}/drain", "Drain a worker", "admin",
              errors=_ADMIN),
)


def document(version: str = "0.1.0") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        entry: dict[str, Any] = {
            "summary": op.summary, "tags": [op.tag],
            "operationId": _operation_id(op),
            "responses": {"200": {"description": "the worker's (or the router's) answer"},
                          **{str(code): ERROR for code in op.errors}},
        }
        params = [{"name": part[1:-1], "in": "path", "required": True,
                   "schema": {"type": "string"}}
                  for part in op.path.split("/") if part.startswith("{")]
        if op.tag == "admin":
            entry["security"] = [{"adminToken": []}]
        if params:
            entry["parameters"] = params
        if op.reads:
            entry["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"type": "object", "additionalProperties": True,
                           "properties": {name: {} for name in op.reads}}}}}
        if op.keyed:
            entry["x-prefix-router-keyed-on"] = op.keyed
            entry["x-prefix-router-failover"] = op.failover
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "prefix-router", "version": version,
                 "description": "A prefix-aware gateway in front of vLLM workers. Routed "
                 "bodies are forwarded unchanged; admin routes exist when "
                 "PREFIX_ROUTER_ADMIN_TOKEN is set."},
        "paths": paths,
        "components": {
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
            "responses": {"Error": {"description": "an error in OpenAI's shape", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {
                "error": {"type": "object", "required": ["message", "type"], "properties": {
                    "message": {"type": "string"}, "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]}}}}}},
        },
    }


def _operation_id(op: Operation) -> str:
    words = [p.strip("{}") for p in op.path.split("/") if p]
    return op.method.lower() + "_" + "_".join(w.replace(".", "_") for w in words)


OPENAPI = web.AppKey("openapi", bytes)


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type="application/json")


def add_route(app: web.Application) -> None:
    app[OPENAPI] = orjson.dumps(document())
    app.router.add_get("/openapi.json", openapi_json)
