"""Typed KV attributes as they travel on the wire: ``{"S": str}``, ``{"N": "<number>"}``, ``{"B": b64}``,
``{"BOOL": bool}``, ``{"TS": "<secs>:<nanos>"}``.

Items store the typed form exactly as the client sent it (after validation), so GetItem echoes values
byte for byte; expressions work on the decoded Python values defined here.

Array attributes are ``B`` blobs in the layout v3io-py (``v3io/dataplane/kv_array.py``) writes and reads:
four little-endian ``uint32`` (magic 11223344, version 1, payload size ``8 * n``, element type 259 for 64-bit
integers or 261 for doubles) followed by the ``n`` elements. A blob in exactly that layout decodes to an
:class:`Array` (the client also tries every ``B`` as an array first); any other blob stays ``bytes``.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

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


ArrayKind = Literal["int", "double"]

_ARRAY_HEADER = struct.Struct("<IIII")
_ARRAY_MAGIC = 11223344
_ARRAY_VERSION = 1
_ARRAY_TYPES: dict[int, ArrayKind] = {259: "int", 261: "double"}
_ARRAY_TYPE_CODES: dict[ArrayKind, int] = {kind: code for code, kind in _ARRAY_TYPES.items()}
_ARRAY_FORMATS: dict[ArrayKind, str] = {"int": "q", "double": "d"}
MAX_ARRAY_LENGTH = 1 << 20
"""Elements an array attribute may hold (8 MiB): what ``init_array`` and slices may create."""
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Array:
    """An array attribute: 64-bit integers (``int``) or doubles (``double``)."""

    kind: ArrayKind
    values: tuple[int | float, ...]


Value = str | int | float | bool | bytes | Timestamp | Array


def parse_array(raw: bytes) -> Array | None:
    """The array a ``B`` blob holds, or ``None`` when the blob is not in the array layout."""
    if len(raw) < _ARRAY_HEADER.size:
        return None
    magic, version, size, code = _ARRAY_HEADER.unpack_from(raw)
    kind = _ARRAY_TYPES.get(code)
    if magic != _ARRAY_MAGIC or version != _ARRAY_VERSION or kind is None:
        return None
    if size % 8 or len(raw) != _ARRAY_HEADER.size + size:
        return None
    values = struct.unpack_from(f"<{size // 8}{_ARRAY_FORMATS[kind]}", raw, _ARRAY_HEADER.size)
    return Array(kind, values)


def array_blob(value: Array) -> bytes:
    """The ``B`` payload of an array, in the layout :func:`parse_array` reads."""
    count = len(value.values)
    header = _ARRAY_HEADER.pack(_ARRAY_MAGIC, _ARRAY_VERSION, count * 8, _ARRAY_TYPE_CODES[value.kind])
    return header + struct.pack(f"<{count}{_ARRAY_FORMATS[value.kind]}", *value.values)


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
        raw = base64.b64decode(value)
        array = parse_array(raw)
        return raw if array is None else array
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
    if isinstance(value, Array):
        return {"B": base64.b64encode(array_blob(value)).decode("ascii")}
    return {"TS": f"{value.secs}:{value.nanos}"}


def number(value: int) -> TypedValue:
    return {"N": str(value)}
