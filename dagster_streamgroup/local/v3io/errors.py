"""The platform's error shape: ``{"ErrorCode": <int>, "ErrorMessage": "<str>"}`` with an HTTP status.

Clients match on the status plus substrings of the body (``ResourceNotFoundException``,
``IllegalLocationException``, ``No such file``, ``Container not found``) and, for a false condition, on
``ErrorCode`` appearing exactly once next to ``16777244``. The constructors below keep those substrings
in one place; the free text after the token names the field and the reason for humans.
"""

from __future__ import annotations

import orjson

# Codes documented for the v3io web API (or chosen to match them where the platform's is unknown).
CODE_NOT_FOUND = -2
CODE_NOT_PERMITTED = -1
CODE_INVALID = -22
CODE_EXISTS = -17
CODE_NOT_DIR = -20
CODE_IS_DIR = -21
CODE_TOO_LARGE = -27
CODE_INTERNAL = -5
CODE_STREAM_INVALID_ARGUMENT = -201326592
CODE_SHARD_OUT_OF_RANGE = -201326594
CODE_RESOURCE_NOT_FOUND = -201326595
CODE_RESOURCE_IN_USE = -201326596
CODE_ILLEGAL_LOCATION = -201326597
CODE_NOT_A_STREAM = -201326598
CODE_CONDITION_FALSE = -16777244
CODE_ITEM_EXISTS = -369098809


class V3ioError(Exception):
    """An error answered to the client; never carries a traceback or a secret."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> bytes:
        return orjson.dumps({"ErrorCode": self.code, "ErrorMessage": self.message})


class ItemExistsError(V3ioError):
    """``CreateNewItemOnly`` on an existing item: frames looks for ``369098809`` with two ``ErrorCode`` keys."""

    def __init__(self, path: str) -> None:
        super().__init__(400, CODE_ITEM_EXISTS, f"CreateNewItemOnly: item {path!r} already exists")

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "ErrorCode": self.code,
                "ErrorMessage": self.message,
                "Inner": {"ErrorCode": CODE_EXISTS, "ErrorMessage": "File exists"},
            }
        )


def no_such_file() -> V3ioError:
    return V3ioError(404, CODE_NOT_FOUND, "No such file or directory")


def container_not_found(container: str) -> V3ioError:
    return V3ioError(404, CODE_NOT_FOUND, f"Container not found: {container!r}")


def invalid(message: str) -> V3ioError:
    """Bad input to a KV, object or listing operation."""
    return V3ioError(400, CODE_INVALID, f"Invalid argument: {message}")


def stream_invalid(message: str) -> V3ioError:
    """Bad input to a stream operation (the streaming API's token comes first)."""
    return V3ioError(400, CODE_STREAM_INVALID_ARGUMENT, f"InvalidArgumentException: {message}")


def resource_not_found(message: str) -> V3ioError:
    return V3ioError(404, CODE_RESOURCE_NOT_FOUND, f"ResourceNotFoundException: {message}")


def resource_in_use(path: str) -> V3ioError:
    return V3ioError(409, CODE_RESOURCE_IN_USE, f"ResourceInUseException: {path!r} already exists")


def not_a_stream(path: str) -> V3ioError:
    return V3ioError(400, CODE_NOT_A_STREAM, f"ResourceIsnotStream: {path!r} is not a stream")


def shard_out_of_range(shard_id: int, shard_count: int) -> V3ioError:
    return V3ioError(
        400,
        CODE_SHARD_OUT_OF_RANGE,
        f"ShardIDOutOfRangeException: shard {shard_id} is not in [0, {shard_count})",
    )


def illegal_location(reason: str) -> V3ioError:
    return V3ioError(400, CODE_ILLEGAL_LOCATION, f"IllegalLocationException: {reason}")


def condition_false() -> V3ioError:
    return V3ioError(400, CODE_CONDITION_FALSE, "Condition evaluated to false; nothing was written")


def not_a_directory(path: str) -> V3ioError:
    return V3ioError(400, CODE_NOT_DIR, f"Not a directory: {path!r}")


def is_a_directory(path: str) -> V3ioError:
    return V3ioError(400, CODE_IS_DIR, f"Is a directory: {path!r}")


def not_permitted(status: int, reason: str) -> V3ioError:
    return V3ioError(status, CODE_NOT_PERMITTED, f"Operation not permitted: {reason}")


def internal_error() -> V3ioError:
    return V3ioError(500, CODE_INTERNAL, "Internal server error (details are in the server log)")
