"""The edge against hostile clients, over raw sockets: slowloris heads and bodies are cut off,
oversized or too many headers and unparseable requests get OpenAI-shaped errors."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import orjson
import pytest

from tests.router.conftest import start_router, start_upstreams
from tests.support import stop

CLIENT_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def router_port() -> Iterator[int]:
    ups = start_upstreams(1)
    port, proc = start_router([u.url for u in ups], "--client-timeout-s", str(CLIENT_TIMEOUT_S),
                              "--max-headers", "20", "--max-header-bytes", "1024")
    yield port
    for p in (proc, *(u.proc for u in ups)):
        stop(p)


def _connect(port: int, timeout: float = 15.0) -> socket.socket:
    """A raw connection; a read that waits past ``timeout`` fails the test."""
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _exchange(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """Read one response to the end (the server closes these connections)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, orjson.loads(body)


def _answer(sock: socket.socket) -> tuple[int, dict]:
    status, _, body = _exchange(sock)
    return status, body


def _openai_error(body: dict) -> bool:
    error = body["error"]
    return isinstance(error["message"], str) and isinstance(error["type"], str)


def _served(port: int) -> bool:
    with _connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(100).startswith(b"HTTP/1.1 200")


def test_a_slow_head_is_cut_off_and_others_are_served(router_port: int) -> None:
    with _connect(router_port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(100):  # one header byte every 0.1 s: never a complete head
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            assert _served(router_port)  # the slow client holds no one else up
            sock.settimeout(0.1)
            try:
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed, "a client trickling its headers kept the connection for 10 s"


def test_a_slow_body_gets_408(router_port: int) -> None:
    with _connect(router_port, timeout=8 * CLIENT_TIMEOUT_S) as sock:  # answered, and closed
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mod")
        status, body = _answer(sock)
    assert status == 408 and _openai_error(body)
    assert body["error"]["code"] == "client_timeout"


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-H%d: v\r\n" % i for i in range(40)) + b"\r\n",  # too many headers
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4000 + b"\r\n\r\n",  # too long
    b"GET /" + b"p" * 4000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # request line too long
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n",  # TLS to a plain port
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",  # smuggling-shaped framing
], ids=["header-count", "header-size", "request-line", "not-http", "cl-and-te"])
def test_unparseable_requests_get_openai_errors(router_port: int, request_bytes: bytes) -> None:
    with _connect(router_port) as sock:
        sock.sendall(request_bytes)
        status, headers, body = _exchange(sock)
    assert 400 <= status < 500 and _openai_error(body), (status, body)
    assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])  # one, though none parsed
    assert _served(router_port)


def test_an_unknown_expectation_gets_417_in_openai_shape(router_port: int) -> None:
    """aiohttp answers an Expect other than 100-continue before any middleware, in plain
    text; the edge gives it OpenAI's shape (found by tests/fuzz)."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with _connect(router_port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n"
                     b"X-Request-Id: exp-1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        status, headers, answer = _exchange(sock)
    assert status == 417 and _openai_error(answer), (status, answer)
    assert headers["content-type"].startswith("application/json")
    assert headers["x-request-id"] == "exp-1"


def test_a_body_not_in_its_content_encoding_gets_400_not_500(router_port: int) -> None:
    """``Content-Encoding: gzip`` on a body that is not gzip: the client's error (it was an
    unhandled exception, a 500; found by tests/fuzz)."""
    body = b'{"model": "m", "prompt": "not gzip"}'
    with _connect(router_port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        status, answer = _answer(sock)
    assert status == 400 and _openai_error(answer), (status, answer)
    assert answer["error"]["code"] == "bad_http"
    assert _served(router_port)
