"""A fast OpenAI-style upstream for the overhead bench: answers at once, no model.

Against it, the time a request takes is the transport and the router hop, which is what
``python -m bench overhead`` measures. ``python -m bench.upstream PORT``.
"""

from __future__ import annotations

import sys

from aiohttp import web

MODEL = "bench-model"
TOKENS = 16
_JSON = (b'{"id":"cmpl-x","object":"text_completion","created":0,"model":"bench-model",'
         b'"choices":[{"index":0,"text":"' + b" tok" * TOKENS + b'","finish_reason":"length"}],'
         b'"usage":{"prompt_tokens":1,"completion_tokens":16,"total_tokens":17}}')
_EVENT = (b'data: {"id":"cmpl-x","object":"text_completion","created":0,"model":"bench-model",'
          b'"choices":[{"index":0,"text":" tok","finish_reason":null}]}\n\n')


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=_JSON, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(TOKENS):
        await resp.write(_EVENT)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def ok(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def metrics(_request: web.Request) -> web.Response:
    return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n",
                        content_type="text/plain")


def app() -> web.Application:
    a = web.Application()
    a.router.add_post("/v1/completions", completions)
    a.router.add_get("/health", ok)
    a.router.add_get("/v1/models", models)
    a.router.add_get("/metrics", metrics)
    for path in ("/get_model_info", "/get_server_info", "/model_info", "/server_info"):
        a.router.add_get(path, ok)
    return a


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
                print=None)
