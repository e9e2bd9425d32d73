"""One fuzz case: a whole HTTP request as bytes on the wire, and the strategies that draw
them from the router's own /openapi.json (which routes exist, which take a body).

A case is a route from the document (or a path near one), a method, headers (the ones
the router reads, X-Context-Hash, X-Request-Id, X-Tenant, X-Priority, Authorization, plus
junk), a body (valid for the API, mutated, or not JSON at all, bodies.py) and a framing
(Content-Length right or short, chunked, broken chunks, gzip, conflicting lengths).
"""

from __future__ import annotations

import functools
import gzip
import re
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.fuzz import bodies

TOKEN = "fuzz-admin-token"
WORKER_IDS = ("sim-fuzz-a", "sim-fuzz-b")  # never drawn as a path parameter: the admin
# routes must not remove or drain the fleet under test
HEX = "0123456789abcdef"
# alphabets as strings: Hypothesis draws such a text as one choice (a regex or a sampled
# alphabet costs one per character, which made generation the fuzzer's bottleneck)
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
NAME_CHARS = ALNUM + "-_"


@dataclass(frozen=True)
class Case:
    kind: str  # what was drawn, for the report ("valid", "mutated", "not-json", ...)
    method: str
    target: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    framing: str  # "raw": the case's own headers frame the body
    chunks: tuple[int, ...] = ()
    version: bytes = b"HTTP/1.1"
    stream: bool = False  # a generation route's body asks for a stream
    router: int = 0  # which router of the fleet answers it

    @property
    def close_after(self) -> bool:
        """Framings that leave the connection in doubt are sent once, with a close."""
        return self.framing not in ("length", "chunked", "gzip", "none") \
            or self.version != b"HTTP/1.1"

    def wire(self) -> bytes:
        head = [f"{self.method} {self.target} ".encode("utf-8", "surrogatepass")
                + self.version, b"Host: 127.0.0.1"]
        head += [name + b": " + value for name, value in self.headers]
        body = self.body
        framing = self.framing
        if framing in ("gzip", "bad-gzip", "bomb"):
            head.append(b"Content-Encoding: gzip")
            if framing != "bad-gzip":
                body = gzip.compress(body, compresslevel=1)
        if framing in ("length", "gzip", "bad-gzip", "bomb"):
            head.append(b"Content-Length: %d" % len(body))
        elif framing == "short":
            head.append(b"Content-Length: %d" % max(0, len(body) - max(1, len(body) // 3)))
        elif framing == "dup-length":
            head += [b"Content-Length: %d" % len(body), b"Content-Length: %d" % (len(body) + 1)]
        elif framing in ("chunked", "both", "bad-chunks"):
            head.append(b"Transfer-Encoding: chunked")
            if framing == "both":
                head.append(b"Content-Length: %d" % len(body))
            body = _chunked(body, self.chunks, broken=framing == "bad-chunks")
        elif framing == "none":
            body = b""
        if self.close_after:
            head.append(b"Connection: close")
        return b"\r\n".join(head) + b"\r\n\r\n" + body

    def describe(self) -> str:
        data = self.wire()
        shown = data if len(data) <= 600 else data[:600] + b"...(%d bytes)" % len(data)
        return f"[{self.kind}, router {self.router}] {shown!r}"

    __repr__ = describe  # failing examples are printed as their bytes, cut short

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.describe())  # Hypothesis's printer would list every field


def _chunked(body: bytes, sizes: tuple[int, ...], broken: bool) -> bytes:
    out, at = [], 0
    for size in (*sizes, len(body)):
        piece = body[at:at + max(1, size)]
        if not piece:
            break
        out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        at += len(piece)
    if broken:
        out.insert(len(out) // 2, b"zz\r\n")
    return b"".join(out) + b"0\r\n\r\n"


def one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in ``n`` draws; False in the simplest example (Hypothesis's first,
    and where it shrinks to), so that one is an ordinary request."""
    return draw(st.integers(1, n)) == n


# -- headers ---------------------------------------------------------------------------
def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


# a header value an HTTP parser accepts (any UTF-8 but control characters), and rarely raw
# bytes, which it mostly refuses: the edge must answer those too, but a case refused at
# the parser exercises nothing behind it
header_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cc",)), max_size=16)
header_value = bodies.rarely(st.binary(max_size=16), header_text.map(_bytes), 8)
context_hash = st.one_of(
    st.text(HEX, min_size=16, max_size=16),  # the SDK's
    st.text(HEX + "ABCDEF", max_size=70),  # odd lengths, upper case
    header_text, bodies.odd_text,
).map(_bytes) | header_value
request_id = st.one_of(
    st.text(ALNUM + "._:-", min_size=1, max_size=128), header_text,
    st.integers(129, 9_000).map(lambda n: "r" * n),
).map(_bytes)
content_type = st.sampled_from([b"application/json", b"application/json; charset=utf-8",
                                b"text/plain", b"application/x-www-form-urlencoded",
                                b"multipart/form-data; boundary=x", b"", b"*/*", b"\xff\xfe",
                                b"application/json; charset=latin-1"])
junk_header = st.tuples(st.text(NAME_CHARS, min_size=1, max_size=12).map(str.encode),
                        header_value)
READ = {  # headers the router (or aiohttp) reads, with values worth trying
    b"X-Context-Hash": context_hash,
    b"X-Request-Id": request_id,
    b"X-Tenant": st.one_of(st.text(ALNUM + "._:@-", min_size=1, max_size=64),
                           header_text).map(_bytes),
    b"X-Priority": st.one_of(st.integers(-(2**70), 2**70).map(str),
                             header_text, st.just("9" * 5000)).map(_bytes),
    b"Authorization": st.one_of(st.just(f"Bearer {TOKEN}"), st.just("Bearer"),
                                header_text.map(lambda t: "Bearer " + t),
                                header_text).map(_bytes),
    b"Accept": st.sampled_from([b"text/event-stream", b"application/json", b"*/*", b"\x01"]),
    b"Accept-Encoding": st.sampled_from([b"gzip", b"br", b"identity;q=0", b"junk"]),
    b"Connection": st.sampled_from([b"keep-alive", b"Upgrade", b"junk"]),
    b"Upgrade": st.sampled_from([b"websocket", b"h2c", b"junk"]),
    b"Expect": st.sampled_from([b"100-continue", b"200-ok", b""]),
    b"traceparent": st.one_of(
        st.just(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), header_value),
    b"Cookie": header_value,
}


_READ_NAMES = st.lists(st.sampled_from(sorted(READ)), max_size=4, unique=True)
_JUNK_HEADERS = st.lists(junk_header, min_size=1, max_size=4)
_BAD_NAMES = st.sampled_from([b"X Bad", b"X:Bad", b"", b"\x00", b"(x)"])


@st.composite
def headers(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    out = [(name, draw(READ[name])) for name in draw(_READ_NAMES)]
    if one_in(draw, 6):
        out += draw(_JUNK_HEADERS)
    if one_in(draw, 61):  # over --max-headers, or one header line over the limit
        out += [(b"X-Many-%d" % i, b"v") for i in range(draw(st.integers(95, 130)))]
    if one_in(draw, 61):
        out.append((draw(_BAD_NAMES), b"v"))
    if one_in(draw, 61):
        out.append((b"X-Folded", b"a\r\n folded"))
    return out


# -- routes, bodies and framing --------------------------------------------------------
@dataclass(frozen=True)
class Route:
    method: str
    path: str  # as documented, {params} included
    reads: tuple[str, ...]
    takes_body: bool
    keyed: bool = False  # routed on its prompt: the router's own request path, drawn oftener


def routes_from(doc: dict[str, Any]) -> list[Route]:
    """Every operation of the router's /openapi.json."""
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            schema = (op.get("requestBody", {}).get("content", {})
                      .get("application/json", {}).get("schema", {}))
            reads = tuple(schema.get("properties", {}))
            body = "requestBody" in op
            out.append(Route(method.upper(), path, reads, body or method.upper() == "POST",
                             body and "routed" in op.get("tags", ())))
    return out


_KINDS = st.sampled_from(["valid"] * 5 + ["mutated"] * 4 + ["not-json", "broken-json",
                                                            "not-object"])
_NOT_OBJECT = bodies.junk.filter(lambda j: not isinstance(j, dict))


@functools.cache
def _body_strategies(route: Route, model: str) -> dict[str, st.SearchStrategy[Any]]:
    """Built once per route: Hypothesis validates a strategy each time one is made."""
    valid = (bodies.VALID[route.path](model) if route.path in bodies.VALID
             else bodies.documented(list(route.reads), model))
    return {"valid": valid, "mutated": bodies.mutated(valid), "not-object": _NOT_OBJECT,
            "not-json": bodies.NOT_JSON, "broken-json": bodies.broken_json(valid)}


@st.composite
def body_for(draw: st.DrawFn, route: Route, model: str) -> tuple[str, bytes, bool]:
    """(kind, bytes, asks for a stream) for a route that takes a body."""
    kind = draw(_KINDS)
    drawn = draw(_body_strategies(route, model)[kind])
    if isinstance(drawn, bytes):
        return kind, drawn, False
    stream = route.keyed and isinstance(drawn, dict) and drawn.get("stream") is True
    return kind, bodies.encode(drawn), stream


FRAMINGS = st.sampled_from(["length"] * 12 + ["chunked"] * 2 + [
    "gzip", "none", "short", "bad-chunks", "both", "dup-length", "bad-gzip"])
_CHUNKS = st.lists(st.integers(1, 64), max_size=4)
path_param = st.one_of(st.text(HEX, min_size=8, max_size=8).map("resp_".__add__),
                       bodies.short_text,
                       st.sampled_from(["w0", "..", "%2e%2e", "%zz", "a/b", "0" * 300])
                       ).filter(lambda v: v not in WORKER_IDS)
_QUERIES = st.sampled_from(["a=1", "stream=true", "%zz", "a=" + "b" * 3000, "&&&",
                            "api-version=2024-02-01"])


def _escaped(value: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() and c not in " ?#/" else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in value) or "x"


@st.composite
def target_for(draw: st.DrawFn, route: Route) -> str:
    target = re.sub(r"\{[^}]+\}", lambda _: _escaped(draw(path_param)), route.path)
    if one_in(draw, 16):
        target += "?" + draw(_QUERIES)
    return target


ODD_METHODS = st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO",
                               "TRACE", "CONNECT", "get", "P(ST"])
ODD_PATHS = st.sampled_from([
    "/", "/v1", "/v1/", "/v1/chat", "/v1/chat/completions/", "//v1/completions",
    "/v1/chat/completions/../completions", "/v1/nope", "/%zz", "*", "/v1/\x7f",
    "/" + "a" * 9_000, "/admin", "/admin/workers/w0/nope"])
ODD_VERSIONS = st.sampled_from([b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b"HTTPS/1.1",
                                b"http/1.1"])


KEYED_WEIGHT = 5  # chat, completions, responses, messages: 4 of some 30 routes, most traffic


def cases_for(routes: list[Route], model: str, routers: int = 1) -> st.SearchStrategy[Case]:
    """Requests at the given routes (the router's document), over ``routers`` routers."""
    weighted = [r for r in routes for _ in range(KEYED_WEIGHT if r.keyed else 1)]
    return case(st.sampled_from(weighted), model, st.integers(0, routers - 1))


@st.composite
def case(draw: st.DrawFn, routes: st.SearchStrategy[Route], model: str,
         routers: st.SearchStrategy[int]) -> Case:
    """One request: mostly a documented route with its own method, sometimes another method,
    an undocumented path or a junk HTTP version."""
    route = draw(routes)
    method, target = route.method, draw(target_for(route))
    roll = draw(st.integers(0, 30))
    if roll == 29:
        method = draw(ODD_METHODS)
    elif roll == 30:
        target = draw(ODD_PATHS)
    version = draw(ODD_VERSIONS) if one_in(draw, 41) else b"HTTP/1.1"
    kind, body, stream, framing = "no-body", b"", False, "none"
    if route.takes_body or method in ("POST", "PUT", "PATCH"):
        if route.path == "/admin/workers" and method == "POST":
            kind, body, stream = "admin", bodies.encode(draw(ADMIN_BODIES)), False
        else:
            kind, body, stream = draw(body_for(route, model))
        framing = draw(FRAMINGS)
        if one_in(draw, 201):
            kind, framing = "bomb", "bomb"
            body = b'{"model": "' + b"0" * draw(st.integers(2, 4)) * 1_000_000 + b'"}'
    hs = [(b"Content-Type", draw(content_type))] if not one_in(draw, 10) else []
    hs += draw(headers())
    chunks = tuple(draw(_CHUNKS)) if framing in ("chunked", "bad-chunks", "both") else ()
    return Case(kind, method, target, tuple(hs), body, framing, chunks, version, stream,
                draw(routers))


# bodies for POST /admin/workers that must be refused: never a real worker added
ADMIN_BODIES = st.one_of(
    _NOT_OBJECT,
    st.dictionaries(st.sampled_from(["id", "models", "x"]), bodies.junk),
    st.fixed_dictionaries({"url": st.one_of(bodies.scalars, st.just("ftp://x"),
                                            st.just("127.0.0.1:1"))
                           .filter(lambda u: not str(u).startswith(("http://", "https://")))},
                          optional={"id": bodies.junk, "models": bodies.junk}),
)
