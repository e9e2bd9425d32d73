"""Who a request is for (its tenant) and how urgent it is (its priority), from the request.

The tenant is the ``X-Tenant`` header (``tenant_from=header``, falling back to the API
key) or the API key alone (``api_key``: clients cannot name themselves). An API key is
never a label or a Redis key: it is replaced by ``key-`` and 12 hex characters of its
SHA-256. Priority follows vLLM: the body's integer ``priority``, else ``X-Priority``;
lower is served first, 0 by default.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from router.routing.errors import Rejected

DEFAULT_TENANT = "default"
_SANE = re.compile(r"[A-Za-z0-9._:@-]{1,64}")


def tenant_of(headers: Mapping[str, str], tenant_from: str, header: str) -> str:
    if tenant_from == "header":
        named = headers.get(header)
        if named is not None:
            if not _SANE.fullmatch(named):
                raise Rejected(400, f"{header} must be 1-64 of [A-Za-z0-9._:@-]",
                               "invalid_tenant")
            return named
    auth = headers.get("Authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not key:
        return DEFAULT_TENANT
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def priority_of(payload: Mapping[str, Any], headers: Mapping[str, str]) -> int:
    raw: Any = payload.get("priority")
    if raw is None:
        raw = headers.get("X-Priority")
        if raw is None:
            return 0
        try:
            raw = int(raw)
        except ValueError:
            raise Rejected(400, "X-Priority must be an integer", "invalid_priority") from None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise Rejected(400, "'priority' must be an integer", "invalid_priority")
    return raw
