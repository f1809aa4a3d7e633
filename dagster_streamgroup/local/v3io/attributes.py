"""Typed KV attributes as they travel on the wire: ``{"S": str}``, ``{"N": "<number>"}``, ``{"B": b64}``,
``{"BOOL": bool}``, ``{"TS": "<secs>:<nanos>"}``.

Items store the typed form exactly as the client sent it (after validation), so GetItem echoes values
byte for byte; expressions work on the decoded Python values defined here.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any, NamedTuple

from dagster_streamgroup.local.v3io import errors

TypedValue = dict[str, Any]
TypedAttributes = dict[str, TypedValue]

ATTRIBUTE_TYPES = frozenset({"S", "N", "B", "BOOL", "TS"})
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_FLOAT_RE = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_TS_RE = re.compile(r"^-?[0-9]+:[0-9]+$")
MAX_NAME_LENGTH = 255
MAX_STRING_LENGTH = 1 << 20

# Attributes the platform maintains itself: readable (by name or with "**"), never writable.
SYSTEM_ATTRIBUTES = frozenset(
    {
        "__name",
        "__size",
        "__mode",
        "__atime_secs",
        "__atime_nsecs",
        "__mtime_secs",
        "__mtime_nsecs",
        "__ctime_secs",
        "__ctime_nsecs",
        "__uid",
        "__gid",
        "__obj_type",
        "__collection_id",
        "__last_sequence_num",
    }
)


class Timestamp(NamedTuple):
    """A ``TS`` value; ordered like time."""

    secs: int
    nanos: int


Value = str | int | float | bool | bytes | Timestamp


def check_name(name: object, *, field: str = "attribute") -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_LENGTH:
        raise errors.invalid(
            f"{field} name {name!r} must match [A-Za-z_][A-Za-z0-9_]* and be at most {MAX_NAME_LENGTH} chars"
        )
    return name


def check_writable(name: str) -> None:
    if name in SYSTEM_ATTRIBUTES:
        raise errors.invalid(f"attribute {name!r} is a system attribute and cannot be written")


def parse_number(text: str) -> int | float:
    """``N`` values are strings; integers stay exact, anything else is a finite float."""
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        value = float(text)
        if math.isfinite(value):
            return value
    raise ValueError(text)


def format_number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise errors.invalid(f"the number {value!r} is not finite")
    return repr(value)


def validate_attributes(raw: object, *, field: str = "Item") -> TypedAttributes:
    """Check a client's typed attribute map and normalise JSON numbers in ``N`` to strings."""
    if not isinstance(raw, dict):
        raise errors.invalid(f"{field} must be an object of typed attributes")
    out: TypedAttributes = {}
    for name, typed in raw.items():
        check_name(name)
        check_writable(name)
        out[name] = validate_value(typed, f"{field}.{name}")
    return out


def validate_value(typed: object, where: str) -> TypedValue:
    if not isinstance(typed, dict) or len(typed) != 1:
        raise errors.invalid(f"{where} must be an object with exactly one of S, N, B, BOOL, TS")
    ((kind, value),) = typed.items()
    if kind == "S":
        if not isinstance(value, str):
            raise errors.invalid(f"{where}.S must be a string")
        if len(value) > MAX_STRING_LENGTH:
            raise errors.invalid(f"{where}.S is longer than {MAX_STRING_LENGTH} characters")
        return {"S": value}
    if kind == "N":
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise errors.invalid(f"{where}.N must be a number written as a string")
        text = value if isinstance(value, str) else format_number(value)
        try:
            parse_number(text)
        except ValueError:
            raise errors.invalid(f"{where}.N {text[:40]!r} is not a finite number") from None
        return {"N": text}
    if kind == "B":
        if not isinstance(value, str):
            raise errors.invalid(f"{where}.B must be a base64 string")
        try:
            binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError):
            raise errors.invalid(f"{where}.B is not valid base64") from None
        return {"B": value}
    if kind == "BOOL":
        if not isinstance(value, bool):
            raise errors.invalid(f"{where}.BOOL must be true or false")
        return {"BOOL": value}
    if kind == "TS":
        if not isinstance(value, str) or not _TS_RE.match(value):
            raise errors.invalid(f"{where}.TS must be '<seconds>:<nanoseconds>'")
        return {"TS": value}
    raise errors.invalid(f"{where} has unknown type {kind!r} (expected one of S, N, B, BOOL, TS)")


def decode(typed: TypedValue) -> Value:
    """The Python value of a stored (already validated) typed attribute."""
    ((kind, value),) = typed.items()
    if kind == "S":
        return str(value)
    if kind == "N":
        return parse_number(str(value))
    if kind == "BOOL":
        return bool(value)
    if kind == "B":
        return base64.b64decode(value)
    secs, nanos = str(value).split(":")
    return Timestamp(int(secs), int(nanos))


def encode(value: Value) -> TypedValue:
    """The typed form of a value computed by an update expression."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float):
        return {"N": format_number(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bytes):
        return {"B": base64.b64encode(value).decode("ascii")}
    return {"TS": f"{value.secs}:{value.nanos}"}


def number(value: int) -> TypedValue:
    return {"N": str(value)}
