"""The committed ranges of each shard, kept beside the group state so a backfill finds their bounds in one bounded
look-up.

A backfill of a sink keyed by range must re-process whole committed ranges (``protocol/backfill.py``), so it needs
their bounds. Dagster's materializations hold them, but only a scan of a shard's history finds the ones over a span,
and Dagster serves at most 10,000 event records a query; the group state holds only the current offsets (a tick
writes it, and it must not grow with history). So each run records the bounds of the ranges it commits here, right
after its commit, one row per range keyed by (state key, shard, end), and a member records those of a run that died
before it could, when it repairs the run's materializations. Ranges of one shard tile its offsets, so the ranges over
``[start, end)`` are those ending in ``(start, end]`` and the first ending after ``end``: two index seeks, whatever
the history. A recorded range replaces any it overlaps (recorded before offsets were moved back), and ranges that
fell out of the stream's retention are dropped as runs record new ones: the index holds what a backfill can still
read, about 2,900 rows a shard a day of the example's ranges.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from dagster_streamgroup.stores.base import StateStore, StoreConfigError

CommittedRange = tuple[str, int, int]
"""``(shard, start, end)``."""


@runtime_checkable
class RangeIndex(Protocol):
    def record_ranges(
        self, key: str, ranges: Sequence[CommittedRange], floors: Mapping[str, int] | None = None
    ) -> None:
        """Record committed ranges of the group ``key``; each replaces any recorded range of its shard it overlaps.
        ``floors``: a shard's earliest retained offset, below which its recorded ranges are dropped."""
        ...

    def ranges_between(self, key: str, shard: str, start: int, end: int) -> list[tuple[int, int]]:
        """The recorded ranges of ``shard`` that overlap ``[start, end)``, in offset order."""
        ...


def range_index(store: StateStore) -> RangeIndex:
    if not isinstance(store, RangeIndex):
        raise StoreConfigError(f"state store {store!r} keeps no index of committed ranges")
    return store


def overlapping(ranges: Sequence[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    return [(lo, hi) for lo, hi in ranges if hi > start and lo < end]


def spans(ranges: Sequence[CommittedRange]) -> list[CommittedRange]:
    """What ranges to record replace: per shard, the span of each chain of consecutive ranges (a run's waves, a
    page of history), so a range recorded out of order (a repair) replaces only what it overlaps itself."""
    out: list[CommittedRange] = []
    last: dict[str, int] = {}
    for shard, start, end in sorted(ranges):
        if shard in last and out[last[shard]][2] == start:
            out[last[shard]] = (shard, out[last[shard]][1], end)
        else:
            last[shard] = len(out)
            out.append((shard, start, end))
    return out


class MemoryRangeIndex:
    """The index in a dict, for the memory store (tests and the simulator)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: dict[tuple[str, str], dict[int, int]] = {}
        """(key, shard) -> {end: start}"""

    def record_ranges(
        self, key: str, ranges: Sequence[CommittedRange], floors: Mapping[str, int] | None = None
    ) -> None:
        with self._lock:
            for shard, lo, hi in spans(ranges):
                held = self._ranges.setdefault((key, shard), {})
                for end, start in list(held.items()):
                    if end > lo and start < hi:
                        del held[end]
            for shard, start, end in ranges:
                self._ranges[(key, shard)][end] = start
            for shard, floor in (floors or {}).items():
                held = self._ranges.get((key, shard), {})
                for end in [e for e in held if e <= floor]:
                    del held[end]

    def ranges_between(self, key: str, shard: str, start: int, end: int) -> list[tuple[int, int]]:
        with self._lock:
            held = dict(self._ranges.get((key, shard), {}))
        return sorted(overlapping([(s, e) for e, s in held.items()], start, end))
