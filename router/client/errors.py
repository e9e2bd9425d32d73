"""Typed exceptions that carry the OpenAI-shaped error body.

Every error the router returns is `{"error": {"message", "type", "code"}}`; keeping that body
on the exception lets callers branch on `type`/`code` without re-parsing anything, and the
class hierarchy lets them branch on what to do (fix the request, back off, fail over).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.client.contract import WORKER_HEADER


class PrefixRouterError(Exception):
    """Base class of every error the SDK raises.

    `attempts` is how many HTTP attempts were made before giving up (1 when not retried)."""

    def __init__(self, message: str, *, body: Mapping[str, Any] | None = None,
                 attempts: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.body: dict[str, Any] = dict(body) if body else {}
        self.attempts = attempts

    @property
    def error(self) -> dict[str, Any]:
        """The inner `{"message", "type", "code"}` object (empty when there was no body)."""
        inner = self.body.get("error")
        return inner if isinstance(inner, dict) else {}

    @property
    def type(self) -> str | None:
        return self.error.get("type")

    @property
    def code(self) -> Any:
        return self.error.get("code")


class APIConnectionError(PrefixRouterError):
    """The router could not be reached (refused, reset, DNS) or the connection broke before
    a response arrived. Retried up to `max_retries`."""


class APITimeoutError(APIConnectionError):
    """The request timed out after it was sent. Not retried: the router may still be
    generating, and a retry would double the work."""


class APIStatusError(PrefixRouterError):
    """The router answered with an HTTP error status."""

    def __init__(self, status: int, body: Mapping[str, Any] | None = None, *,
                 headers: Mapping[str, str] | None = None, attempts: int = 1) -> None:
        body = dict(body) if body else {}
        inner = body.get("error")
        detail = inner.get("message") if isinstance(inner, dict) else None
        super().__init__(f"HTTP {status}: {detail or 'no error message'}", body=body,
                         attempts=attempts)
        self.status = status
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def worker(self) -> str | None:
        """The worker that produced the error, when the router says so."""
        return self.headers.get(WORKER_HEADER)


class BadRequestError(APIStatusError):
    """400: the request itself is wrong; never retried."""


class AuthenticationError(APIStatusError):
    """401."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError):
    """404: e.g. a model no worker serves."""


class RequestTooLargeError(APIStatusError):
    """413."""


class RateLimitError(APIStatusError):
    """429: retried honouring Retry-After, then raised."""


class InternalServerError(APIStatusError):
    """5xx other than 503 (502/504: the upstream worker failed; the router already failed
    over, so the SDK does not retry again)."""


class ServiceUnavailableError(InternalServerError):
    """503: no worker can take the request now; retried honouring Retry-After, then raised."""


class StreamError(PrefixRouterError):
    """A stream failed after it started: an SSE `data: {"error": ...}` event, a broken
    connection, or an end without `[DONE]`. Never retried (text was already delivered)."""

    def __init__(self, message: str, *, body: Mapping[str, Any] | None = None,
                 worker: str | None = None) -> None:
        super().__init__(message, body=body)
        self.worker = worker


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    413: RequestTooLargeError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def status_error(status: int, body: Mapping[str, Any] | None, *,
                 headers: Mapping[str, str] | None = None, attempts: int = 1) -> APIStatusError:
    """The most specific exception for an HTTP error status."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = InternalServerError if status >= 500 else APIStatusError
    return cls(status, body, headers=headers, attempts=attempts)


def error_body(status: int, text: str) -> dict[str, Any]:
    """The OpenAI-shaped body of an error response, synthesised when the server sent none
    (a proxy in between, a crash page), so callers always find `.error["message"]`."""
    return {"error": {"message": text[:2000] or f"HTTP {status}", "type": "http_error",
                      "code": status}}
