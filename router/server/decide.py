"""One routing decision from a request body: the steps both edges run before any byte moves.

The proxy (handlers.py) forwards the original bytes to the ranked workers itself; the
endpoint picker (router/epp) hands the ranking to the gateway that carries them. Both call
``decide`` so the two modes route alike: parse once, fleet, key, candidates, signals, rank.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import orjson

from router.client.contract import PREDICTED_CACHED_HEADER, PREDICTED_TTFT_HEADER
from router.routing import keys
from router.routing.candidate import Candidate
from router.routing.errors import Rejected
from router.routing.pipeline import Pipeline
from router.routing.policies.base import Decision
from router.routing.request import RoutingRequest
from router.server.errors import RequestError

PromptReader = Callable[[dict[str, Any]], bytes]
View = Callable[[dict[str, Any]], dict[str, Any]]
CHAT_PATH = "/v1/chat/completions"
NO_KEY = keys.RoutingKey("", ())
PROMPT_READERS: dict[str, PromptReader | None] = {
    CHAT_PATH: keys.chat_prompt_bytes,
    "/v1/completions": keys.completion_prompt_bytes,
    "/v1/embeddings": None,  # no prefix to reuse: the least-loaded worker
}


@dataclass(frozen=True, slots=True)
class Parsed:
    body: bytes  # forwarded unchanged
    payload: dict[str, Any]
    model: str | None
    stream: bool


@dataclass(frozen=True, slots=True)
class Routed:
    parsed: Parsed
    routing: RoutingRequest
    decision: Decision


async def decide(pipeline: Pipeline, body: bytes, path: str, read_prompt: PromptReader | None,
                 context_hash: str | None, subset: Collection[str] | None = None, *,
                 parsed: Parsed | None = None, chat: bool | None = None,
                 view: View | None = None) -> Routed:
    """Raises ``Rejected`` (a ``RequestError`` for a bad body) with the status to answer.

    ``subset``: worker addresses (``host:port``) the gateway allows for this request; none
    of them routable is a 503, as the endpoint-picker protocol asks. ``view`` shows
    another API's body as a chat request (router/routing/prompt_views.py), keyed as chat;
    ``parsed``: the body, when the caller had to read it first.

    The steps: fleet (the routable workers serving the model), key, candidates (all of
    them, or a large fleet's shortlist), signals, rank."""
    parsed = parsed or parse(body)
    fleet = pipeline.fleet(parsed.model)
    if subset is not None:
        allowed = set(subset)
        fleet = fleet.where(lambda w: address(w.url) in allowed)
        if not fleet.workers:
            raise Rejected(503, "no routable worker in the gateway's endpoint subset",
                           "no_worker_in_subset", retry_after=1)
    if read_prompt is None:
        routing = RoutingRequest(NO_KEY, 0.0, 1.0, parsed.model, source="none")
        candidates = pipeline.routable(fleet)
        return Routed(parsed, routing, Decision(sorted(candidates, key=lambda c: c.load),
                                                "least_loaded"))
    payload = parsed.payload
    if view is not None:
        try:
            payload = view(payload)
        except keys.InvalidPrompt as exc:
            raise RequestError(400, str(exc), "invalid_prompt") from None
    chat = path == CHAT_PATH if chat is None else chat
    routing = await pipeline.key(payload, parsed.model, chat, read_prompt, context_hash, fleet)
    candidates = await pipeline.candidates(routing, fleet)
    await pipeline.annotate(routing, candidates)
    return Routed(parsed, routing, pipeline.rank(routing, candidates))


def parse(body: bytes) -> Parsed:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_body")
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "'model' must be a string", "invalid_model")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", "invalid_stream")
    return Parsed(body, payload, model, stream)


def prediction_headers(candidate: Candidate, exact: bool) -> dict[str, str]:
    """What the router expected of the worker that serves (``candidate``): its predicted
    TTFT (policies that compute one) and, in precise mode (``exact``), the prompt tokens the
    engine should find cached; both edges send them back with the answer."""
    headers: dict[str, str] = {}
    if candidate.ttft_s > 0:
        headers[PREDICTED_TTFT_HEADER] = f"{candidate.ttft_s * 1000:.1f}"
    if exact:
        headers[PREDICTED_CACHED_HEADER] = str(int(candidate.cached_tokens))
    return headers


def address(url: str) -> str:
    """``http://10.0.0.5:8000/`` -> ``10.0.0.5:8000``: a worker as a gateway names it."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    if ":" in host.rsplit("]", 1)[-1]:
        return host
    return host + (":443" if scheme == "https" else ":80")
