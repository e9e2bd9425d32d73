"""One try's accounting: what it reads of the worker's answer."""

from __future__ import annotations

import pytest

from router.fleet.workers import Worker
from router.routing.accounting import Attempt
from router.routing.candidate import Candidate
from router.routing.keys import RoutingKey
from router.routing.request import RoutingRequest
from router.routing.usage import Usage


@pytest.mark.parametrize("stream", [True, False])
def test_usage_split_across_reads_is_still_read(stream: bool) -> None:
    """A read can stop anywhere, inside the usage object too: every cut gives the same
    usage the whole body does."""
    body = (b'data: {"choices":[{"text":"hi"}]}\n\ndata: {"choices":[],"usage":{'
            b'"prompt_tokens":1234,"completion_tokens":5,"total_tokens":1239,'
            b'"prompt_tokens_details":{"cached_tokens":1024}}}\n\ndata: [DONE]\n\n')
    if not stream:
        body = (b'{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":1234,'
                b'"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1024}}}')
    for cut in range(1, len(body)):
        worker = Worker(id="w", url="http://w")
        attempt = Attempt(RoutingRequest(RoutingKey("k", ()), 1234.0, 16.0),
                          Candidate(worker), stream=stream, on_first_byte=lambda a: None)
        attempt.saw(body[:cut])
        attempt.saw(body[cut:])
        assert attempt.usage == Usage(1234, 1024), cut
