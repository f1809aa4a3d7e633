"""Response header names in their canonical case (``Content-Length``, ``Content-Type``, ``Date``, ...), as the
platform's web server sends them, on uvicorn's fast httptools protocol.

uvicorn's httptools protocol lower-cases every response header name; its h11 protocol keeps the case the
application gives but costs about 0.12 ms more server CPU per request (see docs/v3io.md, "Figures").
:class:`CanonicalHeadersProtocol` is the httptools protocol with each request's view of the transport
wrapped so that the response head (written in one piece, after any ``100 Continue``) gets its names
re-cased; bodies pass through untouched. It relies on uvicorn internals (``_start_asgi_task`` and the
cycle's ``transport``), which the ``uvicorn==0.54.0`` pin fixes; a test on the raw response guards it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from dagster_streamgroup.extras import missing_extra

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
except ImportError as exc:
    raise missing_extra("uvicorn", "local", "the local v3io server (streamgroup local v3io)") from exc

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application

_KNOWN = (
    b"Connection",
    b"Content-Length",
    b"Content-Type",
    b"Date",
    b"Last-Modified",
    b"Location",
    b"Server",
    b"Transfer-Encoding",
    b"X-v3io-transaction-verifier",
)
_CANONICAL = {name.lower(): name for name in _KNOWN}
_V3IO_PREFIX = b"x-v3io-"


def canonical_name(name: bytes) -> bytes:
    """``content-length`` → ``Content-Length``; ``x-v3io-*`` keeps the platform's ``X-v3io-`` spelling."""
    known = _CANONICAL.get(name.lower())
    if known is not None:
        return known
    if name.lower().startswith(_V3IO_PREFIX):
        return b"X-v3io-" + name[len(_V3IO_PREFIX) :]
    return b"-".join(part.capitalize() for part in name.split(b"-"))


def canonical_head(data: bytes) -> bytes:
    """A response head (status line, header lines, blank line) with every header name re-cased."""
    head, blank, rest = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    out = [status]
    for line in lines:
        name, colon, value = line.partition(b":")
        out.append(canonical_name(name) + colon + value if colon else line)
    return b"\r\n".join(out) + blank + rest


class _CanonicalHeadTransport:
    """One request's view of the connection: the first final (non-1xx) response head it writes is re-cased."""

    __slots__ = ("_head_written", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head_written = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._head_written and bytes(data[:7]) == b"HTTP/1.":
            raw = bytes(data)
            self._head_written = raw[9:10] != b"1"  # "HTTP/1.1 100 Continue" comes before the real head
            data = canonical_head(raw)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CanonicalHeadersProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol, answering with canonical-case header names."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        cycle.transport = cast(asyncio.Transport, _CanonicalHeadTransport(cycle.transport))
        super()._start_asgi_task(cycle, app)
