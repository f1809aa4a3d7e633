"""What every sink is: a pydantic model (so the Component's YAML is its fields) that writes a run's rows for its
ranges in one commit of its own, before the run commits those ranges into the group state.

The order is the whole guarantee. A run's sink commit comes first, its state commit second, so a run killed
between the two leaves its ranges uncommitted in the group; the range runs again with the same offsets, and its
sink commit must then leave the output as one run would have. Sinks reach that in one of two ways, which the
class says plainly (``replaces_by_coordinates``), because backfills and other writers depend on which:

- **replaced by coordinates** (Delta tables): a commit deletes every row whose source coordinates fall in the
  run's ranges and adds the run's rows, atomically. Any later write of any range covering those records (a retry,
  a handover with other bounds, a backfill running ahead of the group) replaces them, so a backfill needs no
  alignment with the ranges the group committed.
- **written once per offset** (Kafka topics): output is appended, so a commit skips what a marker says is already
  out (the sink's own group offsets, committed in the output's transaction). A backfill of records already
  written produces nothing; re-producing them would need a new output topic.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from dagster_streamgroup.sinks.coordinates import ShardRange

if TYPE_CHECKING:
    import pyarrow as pa

    from dagster_streamgroup.streams.kafka_config import PropertyValue


@dataclass(frozen=True)
class SinkRun:
    """Who writes: the consumer group, and for a member's run its member and run key (none for a backfill).
    ``kafka_client`` builds the group's own Kafka connection (it holds secrets in clear text: never shown),
    which a Kafka sink without a connection of its own uses."""

    group: str
    member: str | None = None
    run_key: str | None = None
    kafka_client: Callable[[], Mapping[str, PropertyValue]] | None = field(default=None, repr=False, compare=False)

    @property
    def backfill(self) -> bool:
        return self.member is None


@dataclass(frozen=True)
class SinkResult:
    """What a sink's commit did, for the ranges' materializations."""

    kind: str
    target: str
    rows: int | None
    """Rows committed (none: not counted, as Spark's executors wrote them: ``RangeFolderSink``)."""
    ranges: int
    skipped_ranges: int = 0
    """Ranges whose output the sink found committed already (a retry after its commit): nothing was written."""
    conflicts: int = 0
    """Commits retried because a concurrent writer committed first (optimistic concurrency)."""
    seconds: float = 0.0
    version: int | None = None
    """The table version of the commit (Delta)."""

    def metadata(self) -> dict[str, str | int | float]:
        out: dict[str, str | int | float] = {"sink": self.kind, "sink_target": self.target}
        if self.rows is not None:
            out["sink_rows"] = self.rows
        out["sink_s"] = round(self.seconds, 3)
        if self.skipped_ranges:
            out["sink_ranges_already_written"] = self.skipped_ranges
        if self.conflicts:
            out["sink_conflicts_retried"] = self.conflicts
        if self.version is not None:
            out["sink_version"] = self.version
        return out


class RangeSink(BaseModel, ABC):
    """A sink for a run's rows: ``write(df, ranges, run)`` commits the rows of exactly those ranges, once."""

    # Errors never echo what was given: a refused setting may be a secret.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    replaces_by_coordinates: ClassVar[bool]
    """True: a write of any range replaces the rows of the records it covers, whatever earlier runs' bounds were
    (a backfill may run ahead of the group, unaligned). False: see the sink's own documentation."""

    @abstractmethod
    def target(self) -> str:
        """Where the rows go, as metadata shows it (never a credential)."""

    @abstractmethod
    def write(self, df: Any, ranges: Sequence[ShardRange], run: SinkRun | None = None) -> SinkResult:
        """Commit ``df``'s rows as the output of ``ranges``: a Spark DataFrame (classic or Connect), a pyarrow
        Table or a pandas DataFrame whose rows keep their source coordinates."""


def to_arrow(df: Any) -> pa.Table:
    """A run's rows as one Arrow table, in the run's process: ``DataFrame.toArrow()`` (PySpark 4, classic and
    Connect), or a pyarrow Table, or a pandas DataFrame."""
    import pyarrow as pa

    if isinstance(df, pa.Table):
        return df
    if isinstance(df, pa.RecordBatch):
        return pa.Table.from_batches([df])
    to_arrow_method = getattr(df, "toArrow", None)
    if callable(to_arrow_method):
        table = to_arrow_method()
        assert isinstance(table, pa.Table)
        return table
    if type(df).__module__.startswith("pandas"):
        return pa.Table.from_pandas(df, preserve_index=False)
    raise TypeError(f"a sink writes a Spark DataFrame, a pyarrow Table or a pandas DataFrame, got {type(df).__name__}")


def backoff_s(attempt: int, base_s: float = 0.05, cap_s: float = 2.0) -> float:
    """Full-jitter exponential backoff between optimistic commits (as members retry their state writes)."""
    import random

    return random.uniform(0, min(cap_s, base_s * 2**attempt))


class Stopwatch:
    def __init__(self) -> None:
        self.started = time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started
