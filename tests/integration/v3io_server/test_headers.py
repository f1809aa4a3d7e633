"""Response header names come in their canonical case (``Content-Length``, ``Content-Type``, ``Date``, ...), as
the platform's web server sends them: clients that compare names exactly (v3io-py's own live test checks
``('Content-Length', '13') in response.headers.items()``) must see them so, on the raw response too."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from dagster_streamgroup.local.v3io.testing import V3ioServerInfo
from dagster_streamgroup.local.v3io.wire import canonical_head, canonical_name
from tests.fixtures.v3io import unique_v3io_name
from tests.integration.v3io_server.helpers import CONTAINER

pytestmark = pytest.mark.v3io

CANONICAL = {"Date", "Content-Type", "Content-Length", "Last-Modified", "X-v3io-transaction-verifier", "Connection"}


@pytest.fixture
def connection(v3io_server: V3ioServerInfo) -> Iterator[http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", v3io_server.port, timeout=10)
    try:
        yield conn
    finally:
        conn.close()


def _exchange(
    conn: http.client.HTTPConnection,
    server: V3ioServerInfo,
    method: str,
    path: str,
    body: bytes = b"",
    function: str | None = None,
) -> tuple[int, list[str], bytes]:
    headers = {"X-v3io-session-key": server.access_key.get_secret_value()}
    if function:
        headers["X-v3io-function"] = function
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, [name for name, _ in response.getheaders()], response.read()


def test_the_real_client_sees_content_length_by_its_exact_name(v3io_client: Any) -> None:
    """v3io-py's ``TestObject.test_object`` checks these pairs verbatim against a real platform."""
    directory = unique_v3io_name("dir")
    v3io_client.object.put(CONTAINER, f"{directory}/obj ect.txt", body="vegans are better than everyone")
    head = v3io_client.object.head(CONTAINER, f"{directory}/obj ect.txt")
    assert ("Content-Length", "31") in head.headers.items()
    assert ("Content-Length", "0") in v3io_client.object.head(CONTAINER, directory).headers.items()
    written = v3io_client.kv.put(CONTAINER, unique_v3io_name("table"), "item", {"a": 1})
    assert "X-v3io-transaction-verifier" in dict(written.headers.items())


def test_raw_response_header_names_are_canonical(
    connection: http.client.HTTPConnection, v3io_server: V3ioServerInfo
) -> None:
    table, stream = unique_v3io_name("table"), unique_v3io_name("stream")
    item = f"/{CONTAINER}/{table}/item"
    cases: list[tuple[str, str, bytes, str | None, int, list[str]]] = [
        ("PUT", item, b'{"Item":{"a":{"N":"1"}}}', "PutItem", 200, ["X-v3io-transaction-verifier"]),
        ("PUT", item, b'{"AttributesToGet":"*"}', "GetItem", 200, ["Content-Type", "X-v3io-transaction-verifier"]),
        ("PUT", f"{item}2", b"{}", "GetItem", 404, ["Content-Type"]),
        ("POST", f"/{CONTAINER}/{stream}/", b'{"ShardCount":1}', "CreateStream", 204, []),
        ("PUT", f"/{CONTAINER}/{table}/obj", b"hello", None, 200, ["X-v3io-transaction-verifier"]),
        ("GET", f"/{CONTAINER}/{table}/obj", b"", None, 200, ["Content-Type", "Last-Modified"]),
        ("HEAD", f"/{CONTAINER}/{table}/obj", b"", None, 200, ["Last-Modified"]),
        ("GET", f"/{CONTAINER}?prefix={table}/", b"", None, 200, ["Content-Type"]),
        ("DELETE", f"/{CONTAINER}/{table}/obj", b"", None, 204, []),
    ]
    for method, path, body, function, status, extra in cases:
        got_status, names, _ = _exchange(connection, v3io_server, method, path, body, function)
        expected = ["Date", *extra] + ([] if status == 204 else ["Content-Length"])
        assert (got_status, sorted(names)) == (status, sorted(expected)), (method, path, function)


def _read_head(sock: socket.socket, buffer: bytearray) -> bytes:
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a response head"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    buffer[:] = rest
    return head


def _header_names(head: bytes) -> list[str]:
    return [line.split(b":", 1)[0].decode() for line in head.split(b"\r\n")[1:]]


def test_heads_after_100_continue_and_pipelined_requests_are_canonical(v3io_server: V3ioServerInfo) -> None:
    key = v3io_server.access_key.get_secret_value()
    path = f"/{CONTAINER}/{unique_v3io_name('table')}/item"
    body = b'{"Item":{"a":{"N":"1"}}}'
    put = (
        f"PUT {path} HTTP/1.1\r\nHost: x\r\nX-v3io-session-key: {key}\r\nX-v3io-function: PutItem\r\n"
        f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    get = (
        f"PUT {path} HTTP/1.1\r\nHost: x\r\nX-v3io-session-key: {key}\r\nX-v3io-function: GetItem\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", v3io_server.port), timeout=10) as sock:
        buffer = bytearray()
        sock.sendall(put)
        assert _read_head(sock, buffer) == b"HTTP/1.1 100 Continue"
        sock.sendall(body)
        head = _read_head(sock, buffer)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert _header_names(head) == ["Date", "X-v3io-transaction-verifier", "Content-Length"]

        sock.sendall(get * 3)
        for _ in range(3):
            head = _read_head(sock, buffer)
            names = _header_names(head)
            assert names == ["Date", "Content-Type", "X-v3io-transaction-verifier", "Content-Length"]
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            while len(buffer) < length:
                buffer += sock.recv(65536)
            assert bytes(buffer[:length]) == b'{"Item":{"a":{"N":"1"}}}'
            del buffer[:length]


def test_an_object_body_that_looks_like_a_head_is_returned_byte_for_byte(
    connection: http.client.HTTPConnection, v3io_server: V3ioServerInfo
) -> None:
    body = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-v3io-thing: y\r\n\r\nabc"
    path = f"/{CONTAINER}/{unique_v3io_name('dir')}/looks-like-http"
    assert _exchange(connection, v3io_server, "PUT", path, body)[0] == 200
    status, names, got = _exchange(connection, v3io_server, "GET", path)
    assert (status, got) == (200, body)
    assert set(names) <= CANONICAL


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"content-length", b"Content-Length"),
        (b"CONTENT-TYPE", b"Content-Type"),
        (b"date", b"Date"),
        (b"x-v3io-transaction-verifier", b"X-v3io-transaction-verifier"),
        (b"x-v3io-other-thing", b"X-v3io-other-thing"),
        (b"www-authenticate", b"Www-Authenticate"),
    ],
)
def test_canonical_name(raw: bytes, expected: bytes) -> None:
    assert canonical_name(raw) == expected


def test_canonical_head_touches_names_only() -> None:
    head = b"HTTP/1.1 200 OK\r\ndate: Mon\r\ncontent-type: a/b:c\r\nx-v3io-transaction-verifier: a==1\r\n\r\n"
    assert canonical_head(head) == (
        b"HTTP/1.1 200 OK\r\nDate: Mon\r\nContent-Type: a/b:c\r\nX-v3io-transaction-verifier: a==1\r\n\r\n"
    )
