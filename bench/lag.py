"""How far the example's group is behind the stream, sampled from the broker in a thread of its own.

Every ``interval_s``: the high watermark of each partition and Kafka's committed offsets of the group (the
group mirrors each commit there, as a consumer group's lag tools expect), or, for a consumer that keeps its
offsets elsewhere (the peer's checkpoint), what ``committed_offsets`` reads. Lag in records is their
difference; the age of the oldest unconsumed record comes from the history of high watermarks
(``HighWatermarkHistory``), without reading records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.figures import HighWatermarkHistory, lag_records, oldest_unconsumed_age
from dagster_streamgroup.streams.base import StreamBackend, StreamError


@dataclass(frozen=True)
class LagSample:
    t: float
    """``time.monotonic()`` when the sample was taken."""
    high_total: int
    lag_records: int
    oldest_age_s: float


@dataclass
class LagSampler:
    backend: StreamBackend
    group: str
    shards: list[str]
    interval_s: float = 2.0
    committed_offsets: Callable[[], Mapping[str, int | None]] | None = None
    """Where the committed offsets come from instead of Kafka's group offsets of ``group``."""
    samples: list[LagSample] = field(default_factory=list)
    errors: int = 0
    history: HighWatermarkHistory = field(default_factory=HighWatermarkHistory.empty)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> LagSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="lag-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> LagSample | None:
        try:
            highs = {shard: marks.high for shard, marks in self.backend.watermarks(self.shards).items()}
            committed = (
                self.backend.committed(self.group, self.shards)
                if self.committed_offsets is None
                else self.committed_offsets()
            )
        except (StreamError, OSError, ValueError):
            with self._lock:
                self.errors += 1
            return None
        t = time.monotonic()
        with self._lock:
            self.history.add(t, highs)
            sample = LagSample(
                t,
                sum(highs.values()),
                lag_records(highs, committed),
                oldest_unconsumed_age(self.history, t, highs, committed),
            )
            self.samples.append(sample)
        return sample

    def between(self, start: float, end: float) -> list[LagSample]:
        with self._lock:
            return [s for s in self.samples if start <= s.t <= end]

    def latest(self) -> LagSample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None
