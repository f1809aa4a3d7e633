"""How to reach a v3io stream: web-API endpoint, container, stream path, and the access key.

The access key is a ``SecretStr`` or the path of a mounted secret file (read only when a client is built,
so a rotated file is picked up); it never appears in a repr, a log line or an error message. Group names
become part of a shard attribute name (``__<group>_committed_sequence_number``), and v3io attribute names
may only hold ``[A-Za-z0-9_]``, so groups are checked here once for every v3io component.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

ACCESS_KEY_ENV = "V3IO_ACCESS_KEY"
"""Where the v3io clients look for the key when none is configured (v3io-py and v3io-go agree)."""

_CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PATH_PART_RE = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
_GROUP_RE = re.compile(r"^[A-Za-z0-9_]{1,128}$")


def check_group(group: str) -> str:
    """A consumer-group name usable in a v3io attribute name (v3io-go's ``__<group>_committed_...``).

    Nuclio's own examples name groups like ``my-consumer-group``; the platform refuses ``-`` in attribute names,
    so such a group cannot commit there either, and mapping it to another name would part us from the
    attribute Nuclio's consumers of the same group use. So it is refused, with the name to use instead."""
    if not isinstance(group, str) or not _GROUP_RE.match(group):
        suggestion = re.sub(r"[^A-Za-z0-9_]", "_", group)[:128] if isinstance(group, str) else ""
        instead = f"; use {suggestion!r} instead" if _GROUP_RE.match(suggestion) else ""
        raise ValueError(
            f"group {group!r}: a v3io consumer-group name may hold only letters, digits and '_' (1-128 "
            "characters), because it becomes part of the shard attribute __<group>_committed_sequence_number "
            f"and v3io attribute names cannot hold other characters{instead}"
        )
    return group


def nuclio_url_fields(value: str) -> str | None:
    """The fields to write for a Nuclio v3io-stream trigger URL (``http://HOST:PORT/CONTAINER/STREAM@GROUP``, or
    its ``CONTAINER/STREAM@GROUP`` tail) given as one field, or None when ``value`` is not one.

    Such a URL is refused rather than taken apart silently: its group may not be a valid one here, and the
    fields say which stream and group this resource is, where a user reading the definitions looks."""
    text = value.strip()
    if "@" not in text:
        return None
    location, _, group = text.rpartition("@")
    endpoint = ""
    if "://" in location:
        parts = urlsplit(location)
        endpoint, location = f"{parts.scheme}://{parts.netloc}", parts.path
    pieces = [p for p in location.split("/") if p]
    if len(pieces) < 2 or not group or "/" in group:
        return None
    named = [f"endpoint={endpoint!r}"] if endpoint else []
    named += [f"container={pieces[0]!r}", f"stream_path={'/'.join(pieces[1:])!r}"]
    suggestion = re.sub(r"[^A-Za-z0-9_]", "_", group)
    note = "" if suggestion == group else f" (not {group!r}: a v3io group name holds only letters, digits and '_')"
    named.append(f"group={suggestion!r}{note}")
    return (
        f"{value!r} is a Nuclio v3io-stream trigger URL (http://HOST:PORT/CONTAINER/STREAM@GROUP); give its parts "
        f"as fields: {', '.join(named)}"
    )


def normalise_endpoint(value: str) -> str:
    """``host:port`` or ``http(s)://host:port`` -> ``http(s)://host:port`` (the client's own defaulting)."""
    text = value.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"}:
        raise ValueError(f"must be http://HOST[:PORT] or https://HOST[:PORT], got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError("must name a host, e.g. http://127.0.0.1:8081")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials; set access_key or access_key_file instead")
    if parts.path or parts.query or parts.fragment:
        raise ValueError("must be only scheme://host[:port], without a path or query")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("has an invalid port (1..65535)") from None
    return f"{parts.scheme}://{parts.netloc}"


def normalise_path(value: str, *, what: str) -> str:
    """A container-relative path: ``/a//b/`` -> ``a/b``, each part a plain name."""
    parts = [p for p in value.strip().split("/") if p]
    if not parts:
        raise ValueError(f"{what} must not be empty")
    for part in parts:
        if part in {".", ".."} or not _PATH_PART_RE.match(part):
            raise ValueError(f"{what} part {part!r} must be 1-255 of [A-Za-z0-9._-] and not '.' or '..'")
    return "/".join(parts)


class V3ioConnection(BaseModel):
    """A v3io web-API endpoint, a container on it, and the key to use."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    endpoint: str = Field(description="The web-API endpoint, e.g. http://v3io-webapi:8081 (V3IO_API).")
    container: str = Field(description="The container (data container name, e.g. 'bigdata' or 'users').")
    access_key: SecretStr | None = Field(
        default=None, description="The access key; default: the V3IO_ACCESS_KEY environment variable."
    )
    access_key_file: Path | None = Field(
        default=None, description="A mounted file holding the access key (read when a client is built)."
    )

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str) -> str:
        hint = nuclio_url_fields(value)
        if hint is not None:
            raise ValueError(hint)
        return normalise_endpoint(value)

    @field_validator("container")
    @classmethod
    def _check_container(cls, value: str) -> str:
        if not _CONTAINER_RE.match(value):
            raise ValueError(f"{value!r} is not a container name (1-128 of [A-Za-z0-9._-], starting alphanumeric)")
        return value

    @field_validator("access_key")
    @classmethod
    def _check_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("must not be empty (leave it unset to use V3IO_ACCESS_KEY or access_key_file)")
        return value

    @model_validator(mode="after")
    def _check_key_source(self) -> Self:
        if self.access_key is not None and self.access_key_file is not None:
            raise ValueError("access_key: set either access_key or access_key_file, not both")
        return self

    def resolve_access_key(self) -> str:
        """The key in clear text, for the client constructor only: never log it."""
        if self.access_key is not None:
            return self.access_key.get_secret_value()
        if self.access_key_file is not None:
            try:
                value = self.access_key_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"access_key_file: cannot read {self.access_key_file}: {exc.strerror}") from None
            if not value:
                raise ValueError(f"access_key_file: {self.access_key_file} is empty")
            return value
        value = os.environ.get(ACCESS_KEY_ENV, "").strip()
        if not value:
            raise ValueError(f"access_key: not set, and neither access_key_file nor ${ACCESS_KEY_ENV} provides one")
        return value

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``v3io.dataplane.Client`` (holds the key in clear text: never log it)."""
        return {"endpoint": self.endpoint, "access_key": self.resolve_access_key()}


class V3ioStreamConfig(V3ioConnection):
    """A v3io stream: where it is and how to read it."""

    stream_path: str = Field(description="The stream's path inside the container, e.g. 'clicks' or 'a/b/clicks'.")
    records_per_request: int = Field(
        default=1000, ge=1, le=10_000, description="GetRecords Limit per request (the platform's default is 1000)."
    )

    @field_validator("stream_path")
    @classmethod
    def _check_stream_path(cls, value: str) -> str:
        hint = nuclio_url_fields(value)
        if hint is not None:
            raise ValueError(hint)
        return normalise_path(value, what="stream_path")

    @property
    def stream_id(self) -> str:
        return stream_id(self.endpoint, self.container, self.stream_path)


def stream_id(endpoint: str, container: str, path: str) -> str:
    """``v3io://host:port/container/path``: the stable name of a v3io stream (scheme-independent)."""
    return f"v3io://{urlsplit(endpoint).netloc}/{container}/{path}"


def parse_stream_id(text: str) -> tuple[str, str] | None:
    """(container, stream path) of a v3io stream id, or None when ``text`` is not one."""
    if not text.startswith("v3io://"):
        return None
    rest = text[len("v3io://") :]
    _netloc, _, location = rest.partition("/")
    container, _, path = location.partition("/")
    if not _CONTAINER_RE.match(container):
        return None
    try:
        return container, normalise_path(path, what="stream path")
    except ValueError:
        return None


CONTAINER_NOT_FOUND = "Container not found"
"""What the platform's 404 body says when the container, not the item or stream, is missing."""


def missing_container(response: Any) -> bool:
    """A 404 about the container itself: never to be read as an absent item, shard or stream."""
    if response.status_code != 404:
        return False
    body = response.body
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    return CONTAINER_NOT_FOUND in text
