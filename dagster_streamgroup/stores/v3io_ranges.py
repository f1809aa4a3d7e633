"""The committed-range index of the v3io store (``stores/ranges.py``): one KV item per committed range.

Items of one shard share a sharding key (``ranges-<digest of the state key and shard>``: v3io keeps them together,
sorted by sorting key) and are named by the range's end, zero-padded so the sorting keys' order is the offsets'. The
ranges over ``[start, end)`` are a range scan of the ends in ``(start, end]`` and the first item after it (a scan of
one item): bounded by what the span holds, as in the SQL store. v3io has no transaction across items, so a record
writes the new items first, then deletes what they replace; a record cut short between the two leaves an overlap that
the backfill plan leaves out (``protocol/backfill.py``), and the next record of the shard clears it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dagster_streamgroup.stores.base import StoreUnavailableError
from dagster_streamgroup.stores.ranges import CommittedRange, overlapping, spans

END_DIGITS = 20
START = "range_start"
END = "range_end"
SHARD = "shard"
PAGE = 1000

Location = tuple[str, str]
"""(container, directory) of a group's items."""


def sharding_key(key: str, shard: str) -> str:
    """A name part without periods (v3io splits an item name at its first period), one per (group, shard)."""
    return "ranges-" + hashlib.sha256(f"{key}\n{shard}".encode()).hexdigest()[:32]


def sort_key(offset: int) -> str:
    return f"{offset:0{END_DIGITS}d}"


class V3ioRangeIndex:
    """The index over the v3io store's client; ``where(key)`` is the group's (container, directory)."""

    def __init__(
        self,
        client: Any,
        where: Callable[[str], Location],
        call: Callable[..., Any],
        unexpected: Callable[[str, Any], StoreUnavailableError],
    ) -> None:
        self._client = client
        self._where = where
        self._call = call
        self._unexpected = unexpected

    def _scan(
        self, what: str, location: Location, shard_key: str, start: str | None, end: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        container, path = location
        items: list[dict[str, Any]] = []
        marker = None
        while True:
            response = self._call(
                what, self._client.kv.scan, container, path,
                attribute_names=[START, END], marker=marker, sharding_key=shard_key,
                sort_key_range_start=start, sort_key_range_end=end, limit=limit or PAGE,
            )  # fmt: skip
            if response.status_code == 404:
                return items
            if response.status_code != 200:
                raise self._unexpected(what, response)
            items.extend(response.output.items)
            marker = response.output.next_marker
            if (limit and len(items) >= limit) or response.output.last or not response.output.items or not marker:
                return items[:limit] if limit else items

    def _delete(self, what: str, location: Location, name: str) -> None:
        container, path = location
        response = self._call(what, self._client.kv.delete, container, path, name)
        if response.status_code not in (200, 204, 404):
            raise self._unexpected(what, response)

    def record_ranges(
        self, key: str, ranges: Sequence[CommittedRange], floors: Mapping[str, int] | None = None
    ) -> None:
        location = self._where(key)
        container, path = location
        what = f"record committed ranges of {key!r}"
        for shard, start, end in ranges:
            name = f"{sharding_key(key, shard)}.{sort_key(end)}"
            response = self._call(
                what, self._client.kv.put, container, path, name, {SHARD: shard, START: start, END: end}
            )
            if response.status_code not in (200, 204):
                raise self._unexpected(what, response)
        recorded = {(shard, end) for shard, _, end in ranges}
        for shard, lo, hi in spans(ranges):
            for item in self._covering(what, location, key, shard, lo, hi):
                if (shard, int(item[END])) not in recorded:
                    self._delete(what, location, f"{sharding_key(key, shard)}.{sort_key(int(item[END]))}")
        for shard, floor in (floors or {}).items():
            for item in self._scan(what, location, sharding_key(key, shard), None, sort_key(floor + 1), None):
                self._delete(what, location, f"{sharding_key(key, shard)}.{sort_key(int(item[END]))}")

    def _covering(
        self, what: str, location: Location, key: str, shard: str, start: int, end: int
    ) -> list[dict[str, Any]]:
        shard_key = sharding_key(key, shard)
        within = self._scan(what, location, shard_key, sort_key(start + 1), sort_key(end + 1), None)
        after = self._scan(what, location, shard_key, sort_key(end + 1), None, 1)
        return [i for i in [*within, *after] if int(i[END]) > start and int(i[START]) < end]

    def ranges_between(self, key: str, shard: str, start: int, end: int) -> list[tuple[int, int]]:
        items = self._covering(f"read committed ranges of {key!r}", self._where(key), key, shard, start, end)
        return sorted(overlapping([(int(i[START]), int(i[END])) for i in items], start, end))
