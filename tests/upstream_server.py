"""A scriptable OpenAI-style upstream, run as a real process, for the proxy's edge cases.

The request's ``X-Test-Mode`` header picks a behaviour (the router forwards it untouched):
  ok (default)   JSON answer naming this upstream
  stream         SSE events; with ``X-Test-Gate: 1`` it pauses after the first event until
                 POST /release, proving the router relays events as they come
  slow-stream    ``n`` events every 20 ms (to be cut by killing the process)
  cut-stream     two events, then the connection is aborted
  linger-stream  events, a usage chunk (``cached_tokens`` 48) and [DONE], then the stream
                 stays open a minute (an engine slow to close after its answer)
  status-NNN     answers NNN with an OpenAI error body
  hang           never answers (until the client goes away: counted as cancelled)
  sleep-MS       answers after MS milliseconds (for load tests; concurrency is tracked)
  set-cookie     the JSON answer with a Set-Cookie header
GET /stats gives counters (``probe_auth``: the Authorization the last /health, /v1/models
and /metrics requests carried); POST /health/{200|503} flips /health; POST
/health-delay/{MS} makes /health answer MS milliseconds late (a busy engine's probe).
"""

from __future__ import annotations

import asyncio
import sys

import orjson
from aiohttp import web

STATS = web.AppKey("stats", dict)
GATE = web.AppKey("gate", asyncio.Event)
NAME = web.AppKey("name", str)
MODEL = web.AppKey("model", str)


USAGE = (b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":5,'
         b'"total_tokens":69,"prompt_tokens_details":{"cached_tokens":48}}}\n\n')


def event(i: int) -> bytes:
    return b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"tok%d "}}]}\n\n' % i


async def generate(request: web.Request) -> web.StreamResponse:
    stats = request.app[STATS]
    stats["requests"] += 1
    stats["in_flight"] += 1
    stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
    stats["headers"] = dict(request.headers)
    body = await request.read()
    stats["last_body"] = body.decode(errors="replace")
    mode = request.headers.get("X-Test-Mode", "ok")
    try:
        return await _respond(request, mode, body)
    except asyncio.CancelledError:
        stats["cancelled"] += 1
        raise
    finally:
        stats["in_flight"] -= 1


async def _respond(request: web.Request, mode: str, body: bytes) -> web.StreamResponse:
    name = request.app[NAME]
    if mode.startswith("status-"):
        status = int(mode.split("-", 1)[1])
        return web.Response(status=status, content_type="application/json",
                            body=orjson.dumps({"error": {"message": f"{name} says {status}",
                                                         "type": "test", "code": status}}))
    if mode == "detail-404":  # FastAPI's own answer, as vLLM gives for a route it lacks
        return web.json_response({"detail": "Not Found"}, status=404)
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode.startswith("sleep-"):
        await asyncio.sleep(int(mode.split("-", 1)[1]) / 1000)
    if mode in ("stream", "slow-stream", "cut-stream", "linger-stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        count = int(request.headers.get("X-Test-Events", "5"))
        for i in range(count):
            await response.write(event(i))
            if i == 0 and request.headers.get("X-Test-Gate") == "1":
                await request.app[GATE].wait()
            if mode == "slow-stream":
                await asyncio.sleep(0.02)
            if mode == "cut-stream" and i == 1:
                request.transport.abort()
                return response
        if mode == "linger-stream":
            await response.write(USAGE + b"data: [DONE]\n\n")
            await asyncio.sleep(60)
            return response
        await response.write(b"data: [DONE]\n\n")
        return response
    response = web.json_response({"object": "chat.completion", "served_by": name,
                                  "choices": [{"index": 0, "message": {"role": "assistant",
                                                                        "content": "ok"}}]})
    if mode == "set-cookie":
        response.set_cookie("session", f"of-{name}")
    return response


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS])


async def release(request: web.Request) -> web.Response:
    request.app[GATE].set()
    return web.json_response({"released": True})


def _probed(request: web.Request) -> None:
    request.app[STATS]["probe_auth"][request.path] = request.headers.get("Authorization")


async def health(request: web.Request) -> web.Response:
    _probed(request)
    if delay := request.app[STATS]["health_delay_ms"]:
        await asyncio.sleep(delay / 1000)
    return web.Response(status=request.app[STATS]["health"], text="health")


async def set_health(request: web.Request) -> web.Response:
    request.app[STATS]["health"] = int(request.match_info["status"])
    return web.json_response({"health": request.app[STATS]["health"]})


async def set_health_delay(request: web.Request) -> web.Response:
    request.app[STATS]["health_delay_ms"] = int(request.match_info["ms"])
    return web.json_response({"health_delay_ms": request.app[STATS]["health_delay_ms"]})


async def metrics(request: web.Request) -> web.Response:
    _probed(request)
    return web.Response(text="# no engine metrics\n")


async def models(request: web.Request) -> web.Response:
    _probed(request)
    return web.json_response({"object": "list", "data": [{"id": request.app[MODEL],
                                                          "object": "model"}]})


def main() -> None:
    port, name, model = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = web.Application()
    app[NAME] = name
    app[MODEL] = model
    app[STATS] = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "cancelled": 0,
                  "health": 200, "health_delay_ms": 0, "probe_auth": {}}
    app[GATE] = asyncio.Event()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/embeddings", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/health/{status}", set_health)
    app.router.add_post("/health-delay/{ms}", set_health_delay)
    app.router.add_get("/stats", stats)
    app.router.add_post("/release", release)
    web.run_app(app, host="127.0.0.1", port=port, print=None,
                handler_cancellation=True)


if __name__ == "__main__":
    main()
