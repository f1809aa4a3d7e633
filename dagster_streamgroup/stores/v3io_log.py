"""Where the v3io state store keeps its log, and what its tokens say: names and key ranges, no I/O.

The base item ``<group>-state.json`` holds the whole state at ``state_version``; every later version ``v`` is one
item ``<group>-state.json.log-<lineage>.<v, 16 digits>`` beside it. v3io reads the part of an item name left of
its leftmost period as the *sharding key* and the rest as the *sorting key*, and keeps the items of one sharding
key together, sorted by sorting key: so the log items of a state are one contiguous range of sorting keys of
the base item's sharding key, and a GetItems range scan (``ShardingKey``, ``SortKeyRangeStart``,
``SortKeyRangeEnd``) returns the versions after ``v`` in order, touching neither the stream's shards nor
other groups' items. Zero-padding makes the sorting keys' string order the versions' order.

The lineage is a random tag the base item gets when it is created (or rewritten from a state without a log):
log items of a deleted and re-created state are of another lineage, so they are never read as versions of
the new one, nor block its versions.
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

_LINEAGE = re.compile(r"^[0-9a-f]{12}$")


def new_lineage() -> str:
    return secrets.token_hex(6)


def _split(item: str) -> tuple[str, str]:
    """(sharding key, sorting key) of an item name, as the platform splits it (at the leftmost period)."""
    sharding_key, _, sorting_key = item.partition(".")
    return sharding_key, sorting_key


def log_item(item: str, lineage: str, version: int) -> str:
    """The name of the log item holding ``version`` of the state in base item ``item``."""
    return f"{item}{LOG_MARK}{lineage}.{version:0{VERSION_DIGITS}d}"


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
    """The log items of every lineage of ``item`` (``-`` sorts just before ``.``)."""
    sharding_key, sorting_key = _split(item)
    return KeyRange(sharding_key, f"{sorting_key}{LOG_MARK}", f"{sorting_key}.log.")


def parse_log_item(item: str, name: str) -> tuple[str, int] | None:
    """(lineage, version) of a log item of base item ``item``; None for any other name."""
    head = f"{item}{LOG_MARK}"
    if not name.startswith(head):
        return None
    lineage, sep, digits = name[len(head) :].partition(".")
    if not sep or not _LINEAGE.match(lineage) or len(digits) != VERSION_DIGITS or not digits.isdigit():
        return None
    return lineage, int(digits)


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


def should_fold(appended_bytes: int, state_bytes: int) -> bool:
    return appended_bytes >= max(MIN_FOLD_BYTES, FOLD_FRACTION * state_bytes)
