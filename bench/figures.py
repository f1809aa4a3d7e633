"""Pure arithmetic of the run-economy benchmarks: percentiles, lag slope, record ages, targets.

No I/O here, so every figure the benchmarks print can be checked by hand from the samples they print.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks; None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q: must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(t, y)`` points, in y per unit of t; None with fewer than two distinct t."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / spread


def second_half(points: Sequence[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The points of ``[start + (end - start) / 2, end]``: the phase after the deployment settled to the rate."""
    middle = start + (end - start) / 2
    return [(t, y) for t, y in points if middle <= t <= end]


def highest_by_step(points: Sequence[tuple[float, float]], start: float, step_s: float) -> list[float]:
    """The highest y of each ``step_s`` from ``start`` (a step without points repeats none): the shape of a
    phase in a line of text, to see where lag built up (a start-up transient, a run's restart, steady growth)."""
    buckets: dict[int, float] = {}
    for t, y in points:
        index = int((t - start) // step_s)
        buckets[index] = max(y, buckets.get(index, y))
    return [buckets[i] for i in sorted(buckets)]


def peak_growth(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """How fast the lag's peaks rise over the second half of ``[start, end]``: the line through the highest
    point of that half's first half and the highest of its last half, in y per second (the two points at
    least an eighth of the phase apart); None without points in both.

    Runs commit in steps, so a deployment that keeps up shows a sawtooth whose least-squares slope over a
    few periods swings by a sizeable share of the rate either way (a quarter of it for a period a third of
    the window); its peaks stay level. A deployment that falls behind raises its peaks by the difference
    between the rates: the peaks of a sawtooth on a trend lie on the trend's line."""
    half = second_half(points, start, end)
    middle = start + (end - start) * 3 / 4
    first = [(y, t) for t, y in half if t < middle]
    last = [(y, t) for t, y in half if t >= middle]
    if not first or not last:
        return None
    (y1, t1), (y2, t2) = max(first), max(last)
    return (y2 - y1) / max(t2 - t1, (end - start) / 8)


def sustained(growth_per_s: float | None, rate: float, tolerance: float) -> bool:
    """Whether the lag did not grow: its growth stays under ``tolerance`` of the production rate."""
    return growth_per_s is not None and growth_per_s <= tolerance * rate


def median_or_none(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class HighWatermarkHistory:
    """When each partition's records became visible: the high watermarks seen at each sample time.

    The age of a partition's oldest unconsumed record is then "now minus when the record at the committed
    offset appeared", interpolated between the two samples around it (the producer writes at a steady rate),
    so no record needs to be read to know how far behind the group is."""

    times: dict[str, list[float]]
    highs: dict[str, list[int]]

    @classmethod
    def empty(cls) -> HighWatermarkHistory:
        return cls({}, {})

    def add(self, t: float, highs: Mapping[str, int]) -> None:
        for shard, high in highs.items():
            seen = self.highs.setdefault(shard, [])
            if not seen or high > seen[-1]:
                seen.append(high)
                self.times.setdefault(shard, []).append(t)

    def appeared_at(self, shard: str, offset: int) -> float | None:
        """When the record at ``offset`` became visible; the first sample time if it predates the history,
        None if it has not appeared yet."""
        highs, times = self.highs.get(shard, []), self.times.get(shard, [])
        index = bisect.bisect_right(highs, offset)  # first sample whose high watermark covers the record
        if index == len(highs):
            return None
        if index == 0:
            return times[0]
        before, after = highs[index - 1], highs[index]
        fraction = (offset - before + 1) / (after - before)
        return times[index - 1] + fraction * (times[index] - times[index - 1])


def oldest_unconsumed_age(
    history: HighWatermarkHistory, t: float, highs: Mapping[str, int], committed: Mapping[str, int | None]
) -> float:
    """Seconds since the oldest record not yet committed by the group appeared (0 when nothing waits)."""
    age = 0.0
    for shard, high in highs.items():
        offset = committed.get(shard) or 0
        if offset >= high:
            continue
        appeared = history.appeared_at(shard, offset)
        if appeared is not None:
            age = max(age, t - appeared)
    return age


def lag_records(highs: Mapping[str, int], committed: Mapping[str, int | None]) -> int:
    """Records produced and not yet committed by the group, over all shards."""
    return sum(max(0, high - (committed.get(shard) or 0)) for shard, high in highs.items())


def target_line(name: str, value: float | None, target: float, *, at_most: bool = True) -> str:
    """``name = value (target <= x: met|not met)`` for the console; targets are printed, never asserted."""
    if value is None:
        return f"{name} = n/a (target {'<=' if at_most else '>='} {target:g})"
    met = value <= target if at_most else value >= target
    return f"{name} = {value:g} (target {'<=' if at_most else '>='} {target:g}: {'met' if met else 'not met'})"
