"""Open-loop load: send each request at its arrival time, stream it, time it client-side.

Open loop (arrivals do not wait for answers) is what production traffic does, and it is
what makes queueing, and so TTFT, depend on the routing policy. Wall-clock times are
divided by the fleet's time scale to give simulated seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import aiohttp
import orjson

from bench.workloads.base import BenchRequest
from router.client.contract import PREDICTED_TTFT_HEADER, REASON_HEADER, WORKER_HEADER


@dataclass(slots=True)
class Record:
    """One request's fate. Times are wall seconds from the start of the run."""

    index: int
    status: str = "not_sent"  # ok | error | timeout | not_sent
    http_status: int = 0
    sent_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    worker: str | None = None
    reason: str | None = None
    predicted_ttft_ms: float | None = None  # the router's, for the worker that served
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    response_id: str | None = None  # the engine's, to join its own per-request timings
    engine_ttft_ms: float | None = None  # the engine's, simulated ms (a simulator's only)
    server_ttft_ms: float | None = None  # its HTTP server's: receipt to first token out
    error: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


async def _one(session: aiohttp.ClientSession, url: str, model: str, req: BenchRequest,
               rec: Record, t0: float) -> None:
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if req.context_hash:
        headers["X-Context-Hash"] = req.context_hash
    rec.sent_s = time.perf_counter() - t0
    try:
        async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
            rec.http_status = resp.status
            rec.worker = resp.headers.get(WORKER_HEADER)
            rec.reason = resp.headers.get(REASON_HEADER)
            if (predicted := resp.headers.get(PREDICTED_TTFT_HEADER)) is not None:
                rec.predicted_ttft_ms = float(predicted)
            if resp.status != 200:
                rec.status, rec.error = "error", (await resp.text())[:300]
                return
            done = False
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                event = orjson.loads(payload)
                if "error" in event:
                    rec.status, rec.error = "error", str(event["error"])[:300]
                    return
                if event.get("choices") and rec.first_token_s is None:
                    rec.first_token_s = time.perf_counter() - t0
                    rec.response_id = event.get("id")
                usage = event.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens", 0)
                    rec.completion_tokens = usage.get("completion_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = details.get("cached_tokens") or 0
            rec.end_s = time.perf_counter() - t0
            rec.status = "ok" if done else "error"
            if not done:
                rec.error = "stream ended without [DONE]"
    except asyncio.CancelledError:
        rec.status, rec.error = "timeout", "cancelled at the drain deadline"
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none is fatal
        rec.status, rec.error = "error", f"{type(exc).__name__}: {exc}"[:300]


async def drive(base_url: str, requests: Sequence[BenchRequest], time_scale: float, *,
                model: str, max_duration_s: float | None = None, drain_s: float = 120.0,
                progress: bool = True) -> tuple[list[Record], float]:
    """Run the load; returns one record per request (sent or not) and the wall duration."""
    url = base_url.rstrip("/") + "/v1/completions"
    records = [Record(index=r.index) for r in requests]
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    tasks: list[asyncio.Task] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        reporter = asyncio.create_task(_progress(records, t0)) if progress else None
        for req, rec in zip(requests, records, strict=True):
            at = req.arrival_s * time_scale
            if max_duration_s is not None and at > max_duration_s:
                break
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, model, req, rec, t0)))
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
        if reporter is not None:
            reporter.cancel()
            _print_progress(records, wall)
            sys.stderr.write("\n")
    return records, wall


def _print_progress(records: Sequence[Record], elapsed: float) -> None:
    sent = sum(r.sent_s is not None for r in records)
    done = sum(r.status == "ok" for r in records)
    failed = sum(r.status in ("error", "timeout") for r in records)
    sys.stderr.write(f"\r  {elapsed:6.1f}s sent {sent}/{len(records)} done {done} "
                     f"in flight {sent - done - failed} failed {failed}   ")
    sys.stderr.flush()


async def _progress(records: Sequence[Record], t0: float) -> None:
    while True:
        await asyncio.sleep(2.0)
        _print_progress(records, time.perf_counter() - t0)
