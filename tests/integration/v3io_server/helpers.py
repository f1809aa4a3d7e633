"""Helpers shared by the v3io server tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
import v3io.dataplane
from v3io.dataplane.response import HttpResponseError

CONTAINER = "bigdata"
NEVER = v3io.dataplane.RaiseForStatus.never


def error_of(response: Any) -> dict[str, Any]:
    """The platform error body of a failed response (``{"ErrorCode": ..., "ErrorMessage": ...}``)."""
    body: dict[str, Any] = json.loads(response.body)
    assert set(body) >= {"ErrorCode", "ErrorMessage"}, body
    return body


def raises_status(status: int) -> Any:
    """``pytest.raises`` for the client's HttpResponseError with that status."""
    return pytest.raises(HttpResponseError, match=f"status {status}")
