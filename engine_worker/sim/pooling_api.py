"""vLLM's pooling-side endpoints on the simulator, in vLLM 0.32's shapes: rerank (three
paths), score (two), pooling, classify, embeddings, detokenize.

Minimal on purpose: a reranker's relevance here is the share of the query's words found in
the document (deterministic, and a document that repeats the query ranks first), a vector
is a hash of the text. They exist so a router's pass-through routes can be tested against
the same server that generates, as a vLLM fleet serves both.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine_worker.sim import openai_api as api
from engine_worker.sim.http import error_response, json_response, read_json
from engine_worker.sim.textgen import token_text

if TYPE_CHECKING:
    from engine_worker.sim.server import SimServer

Handler = Callable[["SimServer", dict[str, Any]], dict[str, Any]]


def add_pooling_routes(app: web.Application, server: SimServer) -> None:
    table: dict[str, Handler] = {
        "/rerank": rerank, "/v1/rerank": rerank, "/v2/rerank": rerank,
        "/score": score, "/v1/score": score,
        "/pooling": pooling, "/classify": classify, "/v1/embeddings": embeddings,
        "/detokenize": detokenize,
    }
    for path, handler in table.items():
        app.router.add_post(path, _endpoint(server, handler))


def _endpoint(server: SimServer, handler: Handler
              ) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
            model = body.get("model") or server.model
            if model != server.model and model not in server.adapters:
                raise api.ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
            return json_response(handler(server, {**body, "model": model}))
        except api.ApiError as err:
            return error_response(err)
    return handle


def _texts(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        return [v if isinstance(v, str) else str(v.get("text", "")) if isinstance(v, dict)
                else str(v) for v in value]
    raise api.ApiError(400, f"'{name}' must be a string or a non-empty list")


def _relevance(query: str, document: str) -> float:
    words = set(query.lower().split())
    found = set(document.lower().split())
    return round(len(words & found) / len(words), 6) if words else 0.0


def _tokens(server: SimServer, texts: list[str]) -> int:
    return sum(len(server.tokenizer.encode(t)) for t in texts)


def rerank(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    query = body.get("query")
    if not isinstance(query, str):
        raise api.ApiError(400, "'query' must be a string")
    documents = _texts(body.get("documents"), "documents")
    results = sorted(({"index": i, "document": {"text": d},
                       "relevance_score": _relevance(query, d)}
                      for i, d in enumerate(documents)),
                     key=lambda r: -r["relevance_score"])
    top_n = body.get("top_n") or 0
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise api.ApiError(400, "'top_n' must be a non-negative integer")
    if top_n:
        results = results[:top_n]
    used = _tokens(server, [query, *documents])
    return {"id": "rerank-" + uuid.uuid4().hex, "model": body["model"],
            "usage": {"prompt_tokens": used, "total_tokens": used}, "results": results}


def score(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    for first, second in (("text_1", "text_2"), ("queries", "documents"),
                          ("queries", "items"), ("data_1", "data_2")):
        if first in body and second in body:
            lefts = _texts(body[first], first)
            rights = _texts(body[second], second)
            break
    else:
        raise api.ApiError(400, "'text_1' and 'text_2' (or 'queries' and 'documents') "
                           "are required")
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    if len(lefts) != len(rights):
        raise api.ApiError(400, "the two sides must have the same length (or one on the left)")
    used = _tokens(server, lefts + rights)
    return {"id": "score-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
            "model": body["model"],
            "data": [{"index": i, "object": "score", "score": _relevance(a, b)}
                     for i, (a, b) in enumerate(zip(lefts, rights, strict=True))],
            "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}}


def _vector(text: str, dims: int = 8) -> list[float]:
    digest = hashlib.blake2b(text.encode(), digest_size=dims).digest()
    return [round(b / 255.0, 6) for b in digest]


def _inputs(server: SimServer, body: dict[str, Any]) -> tuple[list[str], int]:
    texts = _texts(body.get("input"), "input")
    return texts, _tokens(server, texts)


def pooling(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    texts, used = _inputs(server, body)
    return {"id": "pool-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
            "model": body["model"],
            "data": [{"index": i, "object": "pooling", "data": _vector(t)}
                     for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}}


def embeddings(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    texts, used = _inputs(server, body)
    return {"id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
            "model": body["model"],
            "data": [{"index": i, "object": "embedding", "embedding": _vector(t)}
                     for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}}


def classify(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    texts, used = _inputs(server, body)
    data = []
    for i, text in enumerate(texts):
        high = _vector(text, 1)[0]
        probs = [round(1.0 - high, 6), high]
        data.append({"index": i, "label": "LABEL_1" if high > 0.5 else "LABEL_0",
                     "probs": probs, "num_classes": 2})
    return {"id": "classify-" + uuid.uuid4().hex, "object": "list",
            "created": int(time.time()), "model": body["model"], "data": data,
            "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}}


def detokenize(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    """The simulator's tokenizer is one-way (a hash per word), so ids decode to the
    pseudo-words its generations are made of."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise api.ApiError(400, "'tokens' must be a list of token ids")
    return {"prompt": "".join(token_text(t) for t in tokens)}
