"""A raw HTTP/1.1 client for the fuzzer: it sends the exact bytes a case holds (framing,
header bytes and methods an ordinary client refuses to send) and reads one answer.

Why not aiohttp's client: it normalises what the fuzzer must get wrong on purpose
(Content-Length mismatches, broken chunking, control bytes in header values). The reader
is strict where the router must be: a body cut short, a chunked stream without its last
chunk, or no answer within the deadline are failures, never "probably fine".
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

MAX_HEAD = 256 * 1024
_SILENT = "no complete head (0 bytes)"


class Truncated(Exception):
    """The connection ended before a whole answer arrived."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    body: bytes
    closes: bool  # the server said it closes, or HTTP/1.0 without keep-alive
    interim: list[int] = field(default_factory=list)  # 1xx answers seen before it


async def read_answer(reader: asyncio.StreamReader, head_request: bool = False) -> Answer:
    """One whole response (interim 1xx ones skipped and noted)."""
    interim: list[int] = []
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise Truncated(f"no complete head ({len(exc.partial)} bytes)") from None
        except asyncio.LimitOverrunError:
            raise Truncated("response head over the limit") from None
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status = int(rest.split(" ", 1)[0])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            interim.append(status)
            continue
        break
    connection = headers.get("connection", "").lower()
    closes = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
    if head_request or status in (204, 304):
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        try:
            body = await reader.readexactly(int(headers["content-length"]))
        except asyncio.IncompleteReadError as exc:
            raise Truncated(f"body cut at {len(exc.partial)} of "
                            f"{headers['content-length']} bytes") from None
    else:
        body = await reader.read(-1)  # delimited by the close
        closes = True
    return Answer(status, headers, body, closes, interim)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    try:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    except asyncio.IncompleteReadError:
        raise Truncated(f"chunked body without its last chunk after "
                        f"{sum(map(len, parts))} bytes") from None


class Connection:
    """One keep-alive connection to the router."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=MAX_HEAD)
        return cls(reader, writer)

    async def exchange(self, data: bytes, head_request: bool = False) -> Answer:
        self.writer.write(data)
        with contextlib.suppress(ConnectionError):
            # the server may answer (413, 400) and close before reading it all
            await self.writer.drain()
        return await read_answer(self.reader, head_request)

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Idle keep-alive connections, reused across cases as a browser or SDK would."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[Connection] = []

    async def send(self, data: bytes, *, close_after: bool = False,
                   head_request: bool = False) -> Answer:
        """Send on an idle connection; if that one was closed by the server while idle
        (keep-alive timeout: not a byte back), once more on a fresh connection, as HTTP
        clients do. A fresh connection that fails is the router's failure."""
        while self.idle:
            conn = self.idle.pop()
            try:
                answer = await conn.exchange(data, head_request)
            except (Truncated, ConnectionError) as exc:
                conn.close()
                if isinstance(exc, Truncated) and not str(exc).startswith(_SILENT):
                    raise
                continue
            except BaseException:  # a deadline: the connection is in an unknown state
                conn.close()
                raise
            return self._settle(conn, answer, close_after)
        conn = await Connection.open(self.port)
        try:
            answer = await conn.exchange(data, head_request)
        except BaseException:
            conn.close()
            raise
        return self._settle(conn, answer, close_after)

    def _settle(self, conn: Connection, answer: Answer, close_after: bool) -> Answer:
        if answer.closes or close_after:
            conn.close()
        else:
            self.idle.append(conn)
        return answer

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
