"""The edge against hostile clients, over raw sockets: slowloris heads and bodies are cut off,
oversized or too many headers and unparseable requests get OpenAI-shaped errors."""

from __future__ import annotations

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


def _answer(sock: socket.socket) -> tuple[int, dict]:
    """Read one response to the end (the server closes these connections)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


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
        status, body = _answer(sock)
    assert 400 <= status < 500 and _openai_error(body), (status, body)
    assert _served(router_port)
