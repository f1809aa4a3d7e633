"""Where the v3io state store keeps its log, and what its tokens say: names and key ranges, no I/O.

The base item ``<group>-state.json`` holds the whole state at ``state_version``. Every later version ``v`` is one
log item ``<group>-state.json.log-<lineage>.<v, 16 digits>.<write id>`` beside it, and the head item
``<group>-state.json.log-<lineage>.head`` names the newest version and the write id that holds it. v3io reads
the part of an item name left of its leftmost period as the *sharding key* and the rest as the *sorting key*,
and keeps the items of one sharding key together, sorted by sorting key: so the log items of a state are one
contiguous range of sorting keys of the base item's sharding key, and a GetItems range scan (``ShardingKey``,
``SortKeyRangeStart``, ``SortKeyRangeEnd``) returns the versions after ``v`` in order, touching neither the
stream's shards nor other groups' items. Zero-padding makes the sorting keys' string order the versions' order;
the head item's ``head`` sorts after every version.

Why a write id in the name: a log item is written before the head names it, so a writer that loses the race
for the head leaves an item no reader follows; the id keeps it from standing in the way of the winner's.

The lineage is a random tag the base item gets when it is created (or rewritten from a state without a log):
log items of a deleted and re-created state are of another lineage, so they are never read as versions of
the new one, nor block its versions. A lineage of 12 hex digits is the earlier layout (no head item, no write
ids: a version's log item was created only if absent, and that was the compare-and-set); 16 digits this one.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

VERSION = "state_version"
"""Attribute: the version of the state an item holds (the base item's, or a log item's)."""
LINEAGE = "state_lineage"
VERSION_DIGITS = 16
LOG_MARK = ".log-"
HEAD_NAME = "head"

_LINEAGE = re.compile(r"^(?:[0-9a-f]{12}|[0-9a-f]{16})$")
_WRITE_ID = re.compile(r"^[0-9a-f]{12}$")
LEGACY_LINEAGE_CHARS = 12


def new_lineage() -> str:
    return secrets.token_hex(8)


def new_write_id() -> str:
    return secrets.token_hex(6)


def is_lineage(value: object) -> bool:
    """A lineage this store (or its earlier layout) writes."""
    return isinstance(value, str) and _LINEAGE.match(value) is not None


def is_legacy(lineage: str) -> bool:
    """A lineage of the earlier layout, whose log items are named by version alone and have no head item."""
    return len(lineage) == LEGACY_LINEAGE_CHARS


def _split(item: str) -> tuple[str, str]:
    """(sharding key, sorting key) of an item name, as the platform splits it (at the leftmost period)."""
    sharding_key, _, sorting_key = item.partition(".")
    return sharding_key, sorting_key


def log_item(item: str, lineage: str, version: int, write_id: str = "") -> str:
    """The name of the log item holding ``version`` of the state in base item ``item``, written by ``write_id``
    (no id: the earlier layout)."""
    name = f"{item}{LOG_MARK}{lineage}.{version:0{VERSION_DIGITS}d}"
    return f"{name}.{write_id}" if write_id else name


def head_item(item: str, lineage: str) -> str:
    """The name of the item naming the newest version of ``lineage``."""
    return f"{item}{LOG_MARK}{lineage}.{HEAD_NAME}"


@dataclass(frozen=True)
class KeyRange:
    """A GetItems range scan: ``start <= sorting key < end`` among the items of ``sharding_key``."""

    sharding_key: str
    start: str
    end: str


def log_range(item: str, lineage: str, after: int, through: int | None = None) -> KeyRange:
    """The log items of ``lineage`` with a version above ``after`` (and at most ``through``)."""
    sharding_key, sorting_key = _split(item)
    prefix = f"{sorting_key}{LOG_MARK}{lineage}."
    end = f"{prefix}{through + 1:0{VERSION_DIGITS}d}" if through is not None else prefix + ":"  # ':' follows '9'
    return KeyRange(sharding_key, f"{prefix}{after + 1:0{VERSION_DIGITS}d}", end)


def every_lineage_range(item: str) -> KeyRange:
    """The log items (and head items) of every lineage of ``item`` (``-`` sorts just before ``.``)."""
    sharding_key, sorting_key = _split(item)
    return KeyRange(sharding_key, f"{sorting_key}{LOG_MARK}", f"{sorting_key}.log.")


@dataclass(frozen=True)
class LogName:
    """What an item name beside the base item says: its lineage, and the version and write id it holds (the
    head item holds none: ``version`` 0)."""

    lineage: str
    version: int
    write_id: str

    @property
    def is_head(self) -> bool:
        return self.version == 0


def parse_log_item(item: str, name: str) -> LogName | None:
    """The log or head item of base item ``item`` that ``name`` names; None for any other name."""
    head = f"{item}{LOG_MARK}"
    if not name.startswith(head):
        return None
    lineage, sep, rest = name[len(head) :].partition(".")
    if not sep or not _LINEAGE.match(lineage):
        return None
    if rest == HEAD_NAME:
        return None if is_legacy(lineage) else LogName(lineage, 0, "")
    digits, _, write_id = rest.partition(".")
    if len(digits) != VERSION_DIGITS or not digits.isdigit() or int(digits) == 0:
        return None
    if is_legacy(lineage) != (not write_id) or (write_id and not _WRITE_ID.match(write_id)):
        return None
    return LogName(lineage, int(digits), write_id)


# -- tokens ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogToken:
    """A state at ``version`` of ``lineage``: the next write claims ``version + 1``."""

    lineage: str
    version: int

    def __str__(self) -> str:
        return f"v:{self.lineage}:{self.version}"


@dataclass(frozen=True)
class MtimeToken:
    """A base item without a log (written by an earlier version, whole): the next write replaces it under
    this mtime, as that version would."""

    secs: int
    nsecs: int

    def __str__(self) -> str:
        return f"m:{self.secs}:{self.nsecs}"


def parse_token(token: str) -> LogToken | MtimeToken | None:
    """The token this store issued; None for anything else (so never the stored version)."""
    kind, _, rest = str(token).partition(":")
    first, sep, second = rest.partition(":")
    if not sep or not second.isdigit():
        return None
    if kind == "v" and _LINEAGE.match(first):
        return LogToken(first, int(second))
    if kind == "m" and first.isdigit():
        return MtimeToken(int(first), int(second))
    return None


FOLD_FRACTION = 2.0
"""Fold the log into the base item once the log items written since the last fold weigh this much of the
encoded base item: a fold rewrites the whole (compressed) state, so this bounds what folding adds to each write
to half the log's bytes, while a reader that knows nothing of the state reads at most three states' worth."""
MIN_FOLD_BYTES = 64_000
"""... and at least this much: a small state is cheap to read with its log."""


def should_fold(
    appended_bytes: int, state_bytes: int, *, min_bytes: int | None = None, fraction: float | None = None
) -> bool:
    """Whether the log after the base item is worth rewriting the state for (``None``: the module's setting)."""
    least = MIN_FOLD_BYTES if min_bytes is None else min_bytes
    share = FOLD_FRACTION if fraction is None else fraction
    return appended_bytes >= max(least, share * state_bytes)
