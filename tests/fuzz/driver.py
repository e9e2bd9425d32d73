"""Sends batches of fuzz cases concurrently and judges every answer.

Hypothesis calls the test synchronously, once per batch; the sending runs on one event
loop in a background thread so keep-alive connections outlive a batch (a router that
leaves a connection in a bad state answers the next case on it wrongly, and that shows).
Each case has a deadline: no answer within it is a hang.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import orjson

from tests.fuzz.cases import Case
from tests.fuzz.verdict import judge
from tests.fuzz.wire import Pool, Truncated

T = TypeVar("T")
GOOD = orjson.dumps({"model": "fuzz-model", "max_tokens": 2,
                     "messages": [{"role": "user", "content": "Is the router still fine?"}]})


class Driver:
    def __init__(self, ports: list[int], concurrency: int = 24,
                 deadline_s: float = 30.0) -> None:
        self.ports = ports
        self.concurrency = concurrency
        self.deadline_s = deadline_s
        self.sent = 0
        self.statuses: Counter[int] = Counter()
        self.kinds: Counter[str] = Counter()
        self.streams = 0  # 2xx event streams judged
        self.outcomes: Counter[tuple[str, int]] = Counter()  # (kind, status)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._pools = self._call(self._make_pools())

    async def _make_pools(self) -> list[Pool]:
        return [Pool(port) for port in self.ports]

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def run(self, cases: list[Case]) -> list[str]:
        """Send every case (``concurrency`` at a time); the unclean answers, described."""
        return self._call(self._batch(cases))

    async def _batch(self, cases: list[Case]) -> list[str]:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(case: Case) -> str | None:
            async with gate:
                return await self._one(case)

        results = await asyncio.gather(*(one(c) for c in cases))
        return [f"{problem}\n    case: {case.describe()}"
                for case, problem in zip(cases, results, strict=True) if problem]

    async def _one(self, case: Case) -> str | None:
        self.sent += 1
        self.kinds[case.kind] += 1
        try:
            async with asyncio.timeout(self.deadline_s):
                answer = await self._pools[case.router].send(
                    case.wire(), close_after=case.close_after, head_request=case.method == "HEAD")
        except TimeoutError:
            return f"no answer within {self.deadline_s:g}s (a hang)"
        except (Truncated, ConnectionError) as exc:
            return f"no whole answer: {type(exc).__name__}: {exc}"
        self.statuses[answer.status] += 1
        self.outcomes[case.kind, answer.status] += 1
        if answer.status < 300 and answer.headers.get("content-type", "").startswith(
                "text/event-stream"):
            self.streams += 1
        return judge(case, answer)

    def good(self, router: int, stream: bool = False) -> str | None:
        """Why a plain chat request is not served by that router now, or None."""
        return self._call(self._good(router, stream))

    async def _good(self, router: int, stream: bool) -> str | None:
        body = GOOD if not stream else GOOD[:-1] + b',"stream":true}'
        data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (len(body), body))
        try:
            async with asyncio.timeout(self.deadline_s):
                answer = await Pool(self.ports[router]).send(data, close_after=True)
        except (TimeoutError, Truncated, ConnectionError) as exc:
            return f"router {router}: a good request got no answer: {exc!r}"
        if answer.status != 200:
            return f"router {router}: a good request got {answer.status}: {answer.body[:300]!r}"
        if stream:
            return None if answer.body.rstrip().endswith(b"data: [DONE]") else \
                f"router {router}: a good stream did not finish: {answer.body[-300:]!r}"
        content = orjson.loads(answer.body)["choices"][0]["message"]["content"]
        return None if isinstance(content, str) and content else \
            f"router {router}: a good request got no completion: {answer.body[:300]!r}"

    def close(self) -> None:
        async def close_pools() -> None:
            for pool in self._pools:
                pool.close()

        self._call(close_pools())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
