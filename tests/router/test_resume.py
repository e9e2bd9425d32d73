"""Streams resumed on another worker when theirs dies: real simulated vLLM processes, SIGKILL.

The simulator generates text as a pure function of its seed and prompt, so the resumed part
of a stream can be checked exactly: it is what the resuming worker answers, asked directly,
to the continuation vLLM documents (the text so far as a final assistant message with
``continue_final_message``, or appended to a completion's prompt), with ``max_tokens``
reduced by what had been produced.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.redis.fleet import MODEL, Fleet, Proc

PROMPT = "Tell me a long story about caches, routers and engines. " * 8
MAX_TOKENS = 120
KILL_AFTER = 20  # events
RESUMED = 'prefix_router_stream_resumes_total{outcome="resumed"}'


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[Fleet, list[Proc], Proc]]:
    """Five workers for the module: each test kills one, and two survive the last."""
    fleet = Fleet()
    try:
        # 20 ms per generated token: a stream lasts long enough to be killed mid-way
        workers = [fleet.sim(f"w{i}", None, "--seed", str(i), time_scale=2.0)
                   for i in range(5)]
        router = fleet.router("router", None, workers, health_interval_s=0.2)
        yield fleet, workers, router
    finally:
        fleet.close()


def events(raw: bytes) -> list[bytes]:
    return [e[len(b"data: "):] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


async def stream_and_kill(http: aiohttp.ClientSession, router: Proc, workers: list[Proc],
                          path: str, body: dict[str, Any], after: int = KILL_AFTER
                          ) -> tuple[bytes, Proc]:
    """Stream ``body``; SIGKILL the serving worker after ``after`` events; the whole stream."""
    async with http.post(router.url + path, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        victim = next(w for w in workers if w.name == resp.headers["X-Prefix-Router-Worker"])
        raw = b""
        while raw.count(b"\n\n") < after:
            raw += await resp.content.readany()
        victim.proc.send_signal(signal.SIGKILL)
        raw += await resp.content.read()
    return raw, victim


async def direct_text(http: aiohttp.ClientSession, worker: Proc, path: str,
                      body: dict[str, Any]) -> str:
    async with http.post(worker.url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


async def find_split(http: aiohttp.ClientSession, survivors: list[Proc], path: str,
                     texts: list[str], continued: Callable[[str, int], dict[str, Any]]) -> bool:
    """Whether, for some split of the streamed tokens, a survivor asked directly for the
    continuation of the head answers exactly the tail (its first token tried first). The
    split is after the events read before the kill (``stream_and_kill``'s ``after``)."""
    for cut in range(KILL_AFTER - 2, len(texts)):
        head, tail = "".join(texts[:cut]), "".join(texts[cut:])
        for worker in survivors:
            if await direct_text(http, worker, path, continued(head, 1)) != texts[cut]:
                continue
            if await direct_text(http, worker, path, continued(head, len(texts) - cut)) == tail:
                return True
    return False


async def metric(http: aiohttp.ClientSession, router: Proc, line: str) -> float:
    async with http.get(router.url + "/metrics") as resp:
        text = await resp.text()
    found = [row for row in text.splitlines() if row.startswith(line + " ")]
    return float(found[0].split()[-1]) if found else 0.0


async def test_chat_stream_whose_worker_dies_is_continued_in_the_same_stream(
        sims: tuple[Fleet, list[Proc], Proc]) -> None:
    _, workers, router = sims
    messages = [{"role": "user", "content": PROMPT}]
    body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as http:
        resumed = await metric(http, router, RESUMED)
        raw, _ = await stream_and_kill(http, router, workers, "/v1/chat/completions", body)
        assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
        chunks = [orjson.loads(e) for e in events(raw) if e != b"[DONE]"]
        assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert sum("role" in d for d in deltas) == 1 and "role" in deltas[0]
        texts = [d["content"] for d in deltas if d.get("content")]
        assert len(texts) == MAX_TOKENS  # the answer is as long as asked: nothing lost
        assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes.count("length") == 1 and finishes[-1] == "length"

        def continued(head: str, left: int) -> dict[str, Any]:
            return {"model": MODEL, "max_tokens": left,
                    "messages": [*messages, {"role": "assistant", "content": head}],
                    "continue_final_message": True, "add_generation_prompt": False}

        survivors = [w for w in workers if w.proc.poll() is None]
        assert await find_split(http, survivors, "/v1/chat/completions", texts, continued)
        assert await metric(http, router, RESUMED) == resumed + 1


async def test_completion_stream_is_continued_with_its_text_appended_to_the_prompt(
        sims: tuple[Fleet, list[Proc], Proc]) -> None:
    _, workers, router = sims
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    async with aiohttp.ClientSession() as http:
        raw, _ = await stream_and_kill(http, router, workers, "/v1/completions", body)
        assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
        chunks = [orjson.loads(e) for e in events(raw) if e != b"[DONE]"]
        assert len({c["id"] for c in chunks}) == 1
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["text"]]
        assert len(texts) == MAX_TOKENS
        survivors = [w for w in workers if w.proc.poll() is None]
        assert await find_split(http, survivors, "/v1/completions", texts, lambda head, left: {
            "model": MODEL, "prompt": PROMPT + head, "max_tokens": left})


async def test_a_stream_that_cannot_be_continued_still_ends_with_an_error_event(
        sims: tuple[Fleet, list[Proc], Proc]) -> None:
    _, workers, router = sims
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "n": 2}
    async with aiohttp.ClientSession() as http:
        resumed = await metric(http, router, RESUMED)
        raw, _ = await stream_and_kill(http, router, workers, "/v1/completions", body)
        assert b'data: {"error"' in raw and raw.endswith(b"data: [DONE]\n\n")
        assert await metric(http, router, RESUMED) == resumed
