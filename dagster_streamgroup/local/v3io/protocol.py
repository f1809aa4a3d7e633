"""HTTP-independent request/response values and the small helpers every operation shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from dagster_streamgroup.local.v3io import errors

JSON = "application/json"


@dataclass(slots=True)
class Request:
    method: str
    path: str
    """Percent-decoded URL path."""
    query: Mapping[str, str]
    headers: Mapping[str, str]
    """Lower-case header names."""
    body: bytes


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_length: int | None = None
    """Set only for HEAD, where the length describes a body that is not sent."""


def json_response(payload: object, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, orjson.dumps(payload), JSON, headers or [])


def error_response(error: errors.V3ioError) -> Response:
    return Response(error.status, error.body(), JSON)


def json_body(request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The request's JSON object; a clear 400 when it is missing, malformed or not an object."""
    if not request.body.strip():
        if allow_empty:
            return {}
        raise errors.invalid("the request body must be a JSON object")
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise errors.invalid(f"the request body is not valid JSON ({exc.msg})") from None
    if not isinstance(body, dict):
        raise errors.invalid("the request body must be a JSON object")
    return body


def optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise errors.invalid(f"{key} must be a string")
    return value


def optional_int(
    body: Mapping[str, Any], key: str, *, minimum: int | None = None, maximum: int | None = None, stream: bool = False
) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    bad = errors.stream_invalid if stream else errors.invalid
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{key} must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise bad(f"{key} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise bad(f"{key} must be at most {maximum}, got {value}")
    return value
