"""What a clean answer is: a 2xx, or a 4xx whose body is an error in OpenAI's shape; never a
5xx (the fleet's workers answer well, so a 5xx is the router's), never silence, never a
stream that ends in an error event or without its last event.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from tests.fuzz.cases import Case
from tests.fuzz.wire import Answer

_SANE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_FRESH_ID = re.compile(r"[0-9a-f]{32}")
STREAM_ENDS = ("message_stop", "response.completed", "response.incomplete")


def error_shape(body: bytes) -> str | None:
    """Why ``body`` is not ``{"error": {"message", "type", "param", "code"}}``, or None.
    ``code`` may be an integer: vLLM's own errors carry the status there, and the router
    passes a worker's 4xx through unchanged."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"error body is not JSON: {body[:200]!r}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return f"no 'error' object: {body[:200]!r}"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return f"'message' and 'type' must be strings: {body[:200]!r}"
    if "param" not in error or "code" not in error:
        return f"'param' and 'code' must be present: {body[:200]!r}"
    if not isinstance(error["param"], str | None) or isinstance(error["code"], bool) \
            or not isinstance(error["code"], str | int | None):
        return f"'param' must be a string or null, 'code' a string, integer or null: " \
               f"{body[:200]!r}"
    return None


def stream_problem(body: bytes) -> str | None:
    """An SSE body must hold only JSON events (or [DONE]), no error event, and end with
    its API's last event."""
    last: Any = None
    for event in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"".join(line[5:].strip() for line in event.split(b"\n")
                        if line.startswith(b"data:"))
        if not data:
            continue  # a comment (keep-alive) or an event name alone
        if data == b"[DONE]":
            last = "[DONE]"
            continue
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return f"an event is not JSON: {data[:200]!r}"
        if isinstance(doc, dict) and ("error" in doc or doc.get("type") in ("error",
                                                                           "response.failed")):
            return f"error event in the stream: {data[:300]!r}"
        last = doc.get("type") if isinstance(doc, dict) else doc
    if last != "[DONE]" and last not in STREAM_ENDS:
        return f"the stream does not end with its last event (last: {last!r})"
    return None


def request_id_problem(case: Case, answer: Answer) -> str | None:
    """Every answer carries an X-Request-Id: the client's when sane and the request could
    be parsed at all, else a fresh one."""
    given = answer.headers.get("x-request-id")
    if given is None:
        return f"no X-Request-Id on the answer ({answer.status}: {answer.body[:120]!r})"
    sent = [v for n, v in case.headers if n.lower() == b"x-request-id"]
    if len(sent) == 1 and _SANE_ID.fullmatch(sent[0]) and not _unparsed(answer):
        return None if given == sent[0].decode() else \
            f"X-Request-Id {given!r} != {sent[0]!r} sent ({answer.status})"
    return None if _FRESH_ID.fullmatch(given) or _SANE_ID.fullmatch(given.encode()) \
        else f"odd X-Request-Id {given!r}"


def _unparsed(answer: Answer) -> bool:
    """The edge's answer to a request it could not parse (its headers unknown)."""
    return answer.status == 400 and b'"code":"bad_http"' in answer.body


def judge(case: Case, answer: Answer) -> str | None:
    """Why this answer to this case is unclean, or None."""
    status = answer.status
    content_type = answer.headers.get("content-type", "")
    if not (200 <= status < 300 or 400 <= status < 500):
        return f"status {status}: {answer.body[:300]!r}"
    if case.method == "HEAD" and 400 <= status < 500:
        pass  # no body to judge
    elif status >= 400:
        if not content_type.startswith("application/json"):
            return f"{status} with Content-Type {content_type!r}: {answer.body[:200]!r}"
        if (shape := error_shape(answer.body)) is not None:
            return f"{status}: {shape}"
        if status == 429 and "retry-after" not in answer.headers:
            return "429 without Retry-After"
    elif case.method == "HEAD" or status == 204:
        pass  # no body
    elif case.stream and not content_type.startswith("text/event-stream"):
        return f"{status} to a stream request, as {content_type!r}: {answer.body[:200]!r}"
    elif content_type.startswith("text/event-stream"):
        if (problem := stream_problem(answer.body)) is not None:
            return problem
    elif content_type.startswith("application/json"):
        try:
            orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return f"{status} JSON answer is not JSON: {answer.body[:200]!r}"
    return request_id_problem(case, answer)
