"""Who may use the server, and how long a client may take to send its request.

A web page can make a browser send a cross-site POST to 127.0.0.1 with no preflight only as a form (urlencoded,
multipart or text/plain): JSON alone is accepted (415). DNS rebinding reaches loopback under the attacker's name:
the Host header must be one of this server's names (421). An optional bearer token (constant-time compare) keeps
out anyone else who can reach the port. A slow client holds a connection, and up to a body's worth of memory, for
as long as it likes unless something times it out: uvicorn 0.55 has no timeout on receiving a request
(`timeout_keep_alive` runs only between requests, and every byte received resets it), so the headers get a deadline
in the HTTP protocol (`protocol_class`; no ASGI middleware runs before they are parsed) and the body one in the
middleware (`Guard`), which reads it whole before the app sees it. A body is read only where an endpoint takes one:
every refusal, and every answer to a request whose body is not read (a GET /health with a Content-Length), closes
the connection, so that no unread body holds it open by trickling in. Every refusal is counted by reason."""
from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autotune.serve.responses import ErrorResponse

__all__ = ["Access", "Guard", "API_KEY_ENV", "LOCAL_HOSTS", "OUTCOME", "allowed_hosts", "protocol_class"]

# Where a request's final status is left for the accounting middleware (serve/api.py).
OUTCOME = "autotune.outcome"
API_KEY_ENV = "AUTOTUNE_API_KEY"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Paths a probe reads without the key (a load balancer's health check has none); the Host check still applies.
_OPEN_PATHS = ("/health",)


@dataclass(frozen=True, slots=True)
class Access:
    """`allowed_hosts`: Host names accepted beside the local ones and the bound address ("*": any). `api_key`:
    the bearer token every request but /health must carry (None: no auth). Timeouts in seconds from the
    connection's first byte (headers) and from the end of the headers (body). `max_connections`: uvicorn's
    `limit_concurrency` (connections or requests at once; past it, 503)."""

    allowed_hosts: tuple[str, ...] = ()
    api_key: str | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024

    def __post_init__(self) -> None:
        if self.api_key is not None and len(self.api_key) < 8:
            raise ValueError("the API key must be at least 8 characters")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0 or self.max_connections < 1:
            raise ValueError("timeouts and max_connections must be positive")

    @classmethod
    def from_env(cls, allowed_hosts: tuple[str, ...] = (), api_key: str | None = None, **kw) -> Access:
        """`api_key` given, else $AUTOTUNE_API_KEY (kept out of the process list), else none."""
        return cls(tuple(allowed_hosts), api_key or os.environ.get(API_KEY_ENV) or None, **kw)


def _host_name(value: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" -> "::1")."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    name, colon, port = value.rpartition(":")
    return name.rstrip(".") if colon and port.isdigit() and ":" not in name else value.rstrip(".")


def allowed_hosts(bound: str, extra: tuple[str, ...]) -> frozenset[str]:
    """The Host names served: the local ones, the address bound (unless it is a wildcard), and `extra`."""
    names = set(LOCAL_HOSTS) | {_host_name(h) for h in extra}
    if bound not in ("0.0.0.0", "::", ""):
        names.add(_host_name(f"[{bound}]" if ":" in bound else bound))
    return frozenset(names)


class Guard:
    """ASGI middleware, inside the accounting one (so that its refusals are counted by status too): Host, key,
    Content-Type and length, then the body read under its deadline and handed to the app whole."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str], access: Access, max_body_bytes: int,
                 refused: Callable[[str], None], body_paths: tuple[str, ...]) -> None:
        self.app, self.hosts, self.access, self.max_body_bytes = app, hosts, access, max_body_bytes
        self.body_paths = body_paths  # the endpoints that take a body; any other POST is the app's 404 or 405
        self.refused = refused
        self._key = access.api_key.encode() if access.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        takes_body = scope["method"] == "POST" and scope["path"] in self.body_paths
        if refusal is None and takes_body:
            refusal = self._body_refusal(headers)
            if refusal is None:
                body = await self._read(receive)
                if body is None:  # the client left
                    scope.get(OUTCOME, {})["code"] = 499
                    return
                if isinstance(body, tuple):
                    refusal = body
                else:
                    receive = _replay(body, receive)
        if refusal is not None:
            status, reason, message, extra = refusal
            self.refused(reason)
            # Closed after the answer: a body left unread cannot hold the connection by trickling in.
            response = JSONResponse(ErrorResponse.of(status, message, reason).model_dump(), status,
                                    {**extra, "Connection": "close"})
            await response(scope, receive, send)
            return
        if not takes_body and _carries_body(headers):
            # A body where none is read (GET /health with a Content-Length): answered, then closed, as above.
            send = _closing(send)
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple | None:
        host = _host_name(headers.get("host", ""))
        if "*" not in self.hosts and host not in self.hosts:
            shown = host[:100] or "(none)"
            return (421, "host", f"Host {shown!r} is not a name of this server: start it with --allowed-host "
                                 f"{shown} to serve it under that name", {})
        if self._key is not None and scope["path"] not in _OPEN_PATHS:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._key):
                return (401, "auth", "missing or wrong API key: send 'Authorization: Bearer KEY'",
                        {"WWW-Authenticate": "Bearer"})
        return None

    def _body_refusal(self, headers: dict[str, str]) -> tuple | None:
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            return (415, "content_type", f"Content-Type must be application/json, not {media[:60] or '(none)'!r}",
                    {})
        length_text = headers.get("content-length")
        if length_text is None:
            return (411, "length", "Content-Length is required (chunked bodies are not accepted)",
                    {})
        length = int(length_text)  # the HTTP parser refused a malformed one already
        if length > self.max_body_bytes:
            return (413, "length", f"body of {length} bytes exceeds the limit of {self.max_body_bytes} bytes",
                    {})
        return None

    async def _read(self, receive: Receive) -> bytes | tuple | None:
        """The whole body, a refusal when it takes past the deadline, None when the client left."""
        parts: list[bytes] = []
        try:
            async with asyncio.timeout(self.access.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    parts.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        return b"".join(parts)
        except TimeoutError:
            return (408, "body_timeout", f"the body did not arrive within {self.access.body_timeout_s:g} s",
                    {})


def _carries_body(headers: dict[str, str]) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


def _closing(send: Send) -> Send:
    """A send that marks the response `Connection: close` (uvicorn then closes the connection once it is sent)."""
    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*kept, (b"connection", b"close")]}
        await send(message)

    return closing


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then the client's own messages (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _timeout_response(seconds: float) -> bytes:
    body = ErrorResponse.of(408, f"the request headers did not arrive within {seconds:g} s",
                            "header_timeout").model_dump_json().encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def protocol_class(access: Access, refused: Callable[[str], None]) -> type:
    """uvicorn's httptools protocol with a deadline on each request's headers (from the connection, or from the
    next request's first byte), answered 408 and closed past it; and uvicorn's own 503 past
    `limit_concurrency` counted, which it answers without calling the app."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    seconds, limit = access.header_timeout_s, access.max_connections

    class _Protocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            if len(self.connections) >= limit or len(self.tasks) >= limit:
                refused("connections")
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                refused("header_timeout")
                self.transport.write(_timeout_response(seconds))
                self.transport.close()

    return _Protocol
