"""A SASL/PLAIN gate in front of the local broker: the Kafka clients must authenticate before any request
reaches it.

Why it exists: the local broker (Tansu 0.6.0) can require authentication (``--authentication``) and offers
SCRAM-SHA-256/512 only, but its storage engines keep no SCRAM credentials: ``AlterUserScramCredentials`` is
answered with success, ``DescribeUserScramCredentials`` then lists nobody, and every SCRAM login is refused
``unknown-user`` (measured; the ``tansu user create`` command does the same). librdkafka's mock cluster has no
SASL at all. So no local broker can accept a SASL login, and this gate is the one stand-in of the secrets test:
it speaks the broker side of the Kafka SASL exchange (``SaslHandshake`` v0-1, ``SaslAuthenticate`` v0-2,
mechanism PLAIN, as a Kafka broker with ``PlainLoginModule`` does), checks the username and password, and
then relays the connection's bytes untouched to the real broker, which advertises the gate's address so every
connection of every client comes through it. A wrong password is refused with Kafka's own error
(``SASL_AUTHENTICATION_FAILED``) and the connection closed, as a broker does.

``rotate()`` changes the accepted password for new logins only: connections already authenticated stay open,
as Kafka keeps them after a credential change until they re-authenticate.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import struct
import threading
from dataclasses import dataclass

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
MECHANISM = "PLAIN"
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
ILLEGAL_SASL_STATE = 34
MAX_FRAME = 100 * 1024 * 1024


class GateProtocolError(Exception):
    """The client sent something the SASL exchange does not allow; the connection is closed."""


# Pure: the few Kafka protocol messages of the SASL exchange.


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    body_offset: int
    """Where the request body starts in the frame."""


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data):
            raise GateProtocolError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def put_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _skip_tags(data: bytes, offset: int) -> int:
    count, offset = _uvarint(data, offset)
    for _ in range(count):
        _tag, offset = _uvarint(data, offset)
        size, offset = _uvarint(data, offset)
        offset += size
    return offset


def _flexible(api_key: int, api_version: int) -> bool:
    """Whether a request/response of the SASL exchange uses the flexible (tagged) encoding."""
    return api_key == SASL_AUTHENTICATE and api_version >= 2


def parse_request_header(frame: bytes) -> RequestHeader:
    """Header v1 (``api_key, api_version, correlation_id, client_id``), plus tagged fields for flexible versions."""
    if len(frame) < 10:
        raise GateProtocolError("request shorter than its header")
    api_key, api_version, correlation_id, client_id_len = struct.unpack_from(">hhih", frame, 0)
    offset = 10 + max(client_id_len, 0)
    if _flexible(api_key, api_version):
        offset = _skip_tags(frame, offset)
    return RequestHeader(api_key, api_version, correlation_id, offset)


def handshake_mechanism(frame: bytes, header: RequestHeader) -> str:
    (length,) = struct.unpack_from(">h", frame, header.body_offset)
    start = header.body_offset + 2
    return frame[start : start + length].decode("utf-8", "replace")


def handshake_response(correlation_id: int, error_code: int) -> bytes:
    mechanism = MECHANISM.encode()
    return struct.pack(">ihih", correlation_id, error_code, 1, len(mechanism)) + mechanism


def authenticate_bytes(frame: bytes, header: RequestHeader) -> bytes:
    offset = header.body_offset
    if _flexible(header.api_key, header.api_version):
        length, offset = _uvarint(frame, offset)
        return frame[offset : offset + length - 1]
    (length,) = struct.unpack_from(">i", frame, offset)
    return frame[offset + 4 : offset + 4 + length]


def authenticate_response(header: RequestHeader, error_code: int, message: str | None) -> bytes:
    """``error_code, error_message, auth_bytes (empty), session_lifetime_ms (0, v1+)``."""
    text = None if message is None else message.encode()
    if _flexible(header.api_key, header.api_version):
        out = struct.pack(">i", header.correlation_id) + put_uvarint(0)  # response header v1: no tags
        out += struct.pack(">h", error_code)
        out += put_uvarint(0) if text is None else put_uvarint(len(text) + 1) + text
        out += put_uvarint(1)  # empty auth_bytes
        out += struct.pack(">q", 0) + put_uvarint(0)
        return out
    out = struct.pack(">ih", header.correlation_id, error_code)
    out += struct.pack(">h", -1) if text is None else struct.pack(">h", len(text)) + text
    out += struct.pack(">i", 0)
    if header.api_version >= 1:
        out += struct.pack(">q", 0)
    return out


def plain_credentials(token: bytes) -> tuple[str, str]:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        raise GateProtocolError("malformed PLAIN token")
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")


# I/O: the gate.


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks += chunk
    return bytes(chunks)


def _recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if not 0 <= size <= MAX_FRAME:
        raise GateProtocolError(f"frame size {size}")
    return _recv_exact(sock, size)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">i", len(payload)) + payload)


class SaslPlainGate:
    """Listens on a free 127.0.0.1 port; a client that logs in as ``username`` with the current password is
    relayed to ``target``. ``accepted`` and ``refused`` count the logins, so a test can show the gate was used."""

    def __init__(self, target: tuple[str, int], username: str, password: str, port: int | None = None) -> None:
        self.target = target
        self.username = username
        self._password = password
        self.accepted = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port or 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="sasl-gate").start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def rotate(self, password: str) -> None:
        """New logins need ``password``; established connections are kept."""
        with self._lock:
            self._password = password

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.update(socks)

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream: socket.socket | None = None
        try:
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            self._track(upstream)
            if self._authenticate(client, upstream):
                threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
                self._pump(client, upstream)
                return
        except (OSError, ConnectionError, GateProtocolError, struct.error):
            pass
        self._close(client, *([upstream] if upstream is not None else []))

    def _authenticate(self, client: socket.socket, upstream: socket.socket) -> bool:
        """The SASL exchange; ApiVersions (which clients send first) is answered by the broker itself."""
        mechanism_ok = False
        while True:
            frame = _recv_frame(client)
            header = parse_request_header(frame)
            if header.api_key == API_VERSIONS:
                _send_frame(upstream, frame)
                _send_frame(client, _recv_frame(upstream))
            elif header.api_key == SASL_HANDSHAKE:
                mechanism_ok = handshake_mechanism(frame, header) == MECHANISM
                error = 0 if mechanism_ok else UNSUPPORTED_SASL_MECHANISM
                _send_frame(client, handshake_response(header.correlation_id, error))
                if not mechanism_ok:
                    return False
            elif header.api_key == SASL_AUTHENTICATE and mechanism_ok:
                username, password = plain_credentials(authenticate_bytes(frame, header))
                with self._lock:
                    expected = self._password
                ok = hmac.compare_digest(username.encode(), self.username.encode()) and hmac.compare_digest(
                    password.encode(), expected.encode()
                )
                with self._lock:
                    if ok:
                        self.accepted += 1
                    else:
                        self.refused += 1
                message = None if ok else "Authentication failed: Invalid username or password"
                code = 0 if ok else SASL_AUTHENTICATION_FAILED
                _send_frame(client, authenticate_response(header, code, message))
                return ok
            else:
                return False  # any other request before a login: the broker closes the connection

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source, sink)

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            self._sockets.difference_update(socks)

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            socks = list(self._sockets)
        self._close(*socks)
