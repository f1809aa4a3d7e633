"""Request paths: ``/<container>/<path>`` percent-decoded, with ``//`` collapsed and the trailing ``/`` noted.

Inside the server a path is container-relative with no leading or trailing slash; ``""`` is the
container's root directory.
"""

from __future__ import annotations

from typing import NamedTuple

from dagster_streamgroup.local.v3io import errors

MAX_PATH_LENGTH = 4096
MAX_NAME_LENGTH = 255


class Target(NamedTuple):
    container: str
    path: str
    trailing_slash: bool


def parse(raw: str) -> Target | None:
    """Split a decoded URL path; ``None`` for ``/`` (the list of containers)."""
    if len(raw) > MAX_PATH_LENGTH:
        raise errors.invalid(f"path is longer than {MAX_PATH_LENGTH} characters")
    parts = [part for part in raw.split("/") if part]
    if not parts:
        return None
    for part in parts:
        check_component(part)
    trailing = raw.endswith("/") and len(parts) > 1
    return Target(parts[0], "/".join(parts[1:]), trailing)


def check_component(part: str) -> None:
    if part in (".", ".."):
        raise errors.invalid(f"path component {part!r} is not allowed")
    if len(part) > MAX_NAME_LENGTH:
        raise errors.invalid(f"path component {part[:40]!r}... is longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in part:
        raise errors.invalid("path contains a NUL character")


def normalise(path: str) -> str:
    """A container-relative path from client input (listing prefixes, ``TableName``)."""
    parts = [part for part in path.split("/") if part]
    for part in parts:
        check_component(part)
    return "/".join(parts)


def split(path: str) -> tuple[str, str]:
    """``("a/b", "c")`` for ``"a/b/c"``; the root has no parent and is never split."""
    parent, _, name = path.rpartition("/")
    return parent, name


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name
