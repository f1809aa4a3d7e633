"""The ASGI application: authentication, dispatch on ``X-v3io-function`` (or the method when there is none),
and the platform's error shape for every failure.

Handlers are synchronous and run on the event loop one at a time. Connections are still served
concurrently (the loop reads, parses and writes all of them), and running each request to completion
without interleaving is what makes a conditional write an atomic compare-and-set without locks.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl

from dagster_streamgroup.local.v3io import errors, kv, objects, paths
from dagster_streamgroup.local.v3io.config import ServerConfig
from dagster_streamgroup.local.v3io.paths import Target
from dagster_streamgroup.local.v3io.protocol import Request, Response, error_response
from dagster_streamgroup.local.v3io.storage import Storage
from dagster_streamgroup.local.v3io.streams import StreamEngine, StreamSettings

log = logging.getLogger("dagster_streamgroup.local.v3io")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Target, Request], Response]


class V3ioApp:
    def __init__(self, store: Storage, config: ServerConfig) -> None:
        self.store = store
        self.config = config
        self.started_ns = time.time_ns()
        self.streams = StreamEngine(store, StreamSettings(hour_seconds=config.hour_seconds))
        self.functions: dict[str, Handler] = {
            "CreateStream": self.streams.create,
            "UpdateStream": self.streams.update,
            "DescribeStream": self.streams.describe,
            "PutRecords": self.streams.put_records,
            "SeekShard": self.streams.seek,
            "Seek": self.streams.seek,
            "GetRecords": self.streams.get_records,
            "PutItem": lambda target, request: kv.put_item(store, target, request),
            "UpdateItem": lambda target, request: kv.update_item(store, target, request),
            "GetItem": lambda target, request: kv.get_item(store, target, request),
            "GetItems": lambda target, request: kv.get_items(store, target, request),
        }

    # --- pure request handling --------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        try:
            return self._handle(request)
        except errors.V3ioError as exc:
            return error_response(exc)
        except Exception:
            log.exception("unexpected failure handling %s %s", request.method, request.path[:200])
            return error_response(errors.internal_error())

    def _handle(self, request: Request) -> Response:
        self._authenticate(request)
        function = request.headers.get("x-v3io-function")
        target = paths.parse(request.path)
        method = request.method
        if target is None:
            if function is None and method in ("GET", "HEAD"):
                return objects.list_containers(self.config.containers, self.started_ns)
            raise errors.invalid("the URL must start with a container name")
        if target.container not in self.config.containers:
            raise errors.container_not_found(target.container)
        if function is not None:
            handler = self.functions.get(function.strip())
            if handler is None:
                raise errors.invalid(
                    f"X-v3io-function {function[:60]!r} is not supported (supported: {', '.join(self.functions)})"
                )
            return handler(target, request)
        if method == "GET":
            if not target.path or "prefix" in request.query:
                return objects.list_directory(self.store, target.container, request)
            return objects.get_object(self.store, target, request)
        if method in ("PUT", "POST"):
            return objects.put_object(self.store, target, request)
        if method == "HEAD":
            return objects.head_object(self.store, target)
        if method == "DELETE":
            return objects.delete_object(self.store, target)
        raise errors.V3ioError(405, errors.CODE_INVALID, f"method {method[:20]} is not supported")

    def _authenticate(self, request: Request) -> None:
        key = request.headers.get("x-v3io-session-key", "")
        if not key:
            key = _basic_password(request.headers.get("authorization", ""))
        if not key:
            raise errors.not_permitted(401, "send an access key in X-v3io-session-key")
        expected = self.config.access_key
        if expected is not None and not hmac.compare_digest(
            key.encode("utf-8", "surrogateescape"), expected.get_secret_value().encode()
        ):
            raise errors.not_permitted(403, "the access key is not valid")

    # --- ASGI -----------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            body = await self._read_body(scope, receive)
        except errors.V3ioError as exc:
            await _send(send, "GET", error_response(exc), close=True)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        request = Request(scope["method"], scope["path"], query, headers, body)
        await _send(send, scope["method"], self.handle(request))

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise errors.V3ioError(413, errors.CODE_TOO_LARGE, f"the request body is larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise errors.V3ioError(413, errors.CODE_TOO_LARGE, f"the request body is larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _basic_password(header: str) -> str:
    """v3io-go authenticates with ``Authorization: Basic base64(user:password)`` when it has no access key."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return ""
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        return ""
    return decoded.partition(":")[2]


@functools.lru_cache(maxsize=1)
def _date(second: int) -> bytes:
    """The ``Date`` header's value, formatted once per second."""
    return formatdate(second, usegmt=True).encode()


async def _send(send: Send, method: str, response: Response, *, close: bool = False) -> None:
    # Header names in their canonical case, as the platform's web server sends them (uvicorn's httptools
    # protocol lower-cases them; server.py runs it through wire.CanonicalHeadersProtocol, which re-cases).
    headers: list[tuple[bytes, bytes]] = [(b"Date", _date(int(time.time())))]
    if response.content_type:
        headers.append((b"Content-Type", response.content_type.encode()))
    headers.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers)
    if response.status != 204:
        length = response.content_length if response.content_length is not None else len(response.body)
        headers.append((b"Content-Length", str(length).encode()))
    if close:
        headers.append((b"Connection", b"close"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    body = b"" if method == "HEAD" or response.status == 204 else response.body
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
