"""Why routing refuses a request, in terms the edge turns into an HTTP error."""

from __future__ import annotations


class Rejected(Exception):
    """``status`` and ``code`` follow OpenAI's error shape; the edge renders them."""

    def __init__(self, status: int, message: str, code: str,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after
