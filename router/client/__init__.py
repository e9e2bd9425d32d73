"""prefix-router client SDK: OpenAI-compatible calls that name their retrieved context.

Independent of the router's server code (it imports nothing else from `router`), so an
application needs only aiohttp: sdk/pyproject.toml builds it alone as prefix-router-client.
See the README, "Client SDK and sidecar mode".
"""

from router.client.async_client import AsyncContextClient
from router.client.contract import CONTEXT_HASH_HEADER
from router.client.errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    PrefixRouterError,
    RateLimitError,
    RequestTooLargeError,
    ServiceUnavailableError,
    StreamError,
)
from router.client.hashing import (
    context_hash,
    join_documents,
    openai_headers,
)
from router.client.results import AsyncStream, Completion
from router.client.retry import Backoff
from router.client.sync_client import ContextClient, Stream

__all__ = [
    "CONTEXT_HASH_HEADER",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncContextClient",
    "AsyncStream",
    "AuthenticationError",
    "Backoff",
    "BadRequestError",
    "Completion",
    "ContextClient",
    "InternalServerError",
    "NotFoundError",
    "PermissionDeniedError",
    "PrefixRouterError",
    "RateLimitError",
    "RequestTooLargeError",
    "ServiceUnavailableError",
    "Stream",
    "StreamError",
    "context_hash",
    "join_documents",
    "openai_headers",
]
