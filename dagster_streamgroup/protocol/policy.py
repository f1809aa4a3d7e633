"""The knobs of the group protocol, validated once at load so a bad value fails with its field name."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GroupPolicy(BaseModel):
    """How members behave. One source of truth for defaults (Nuclio's docs and code disagree on theirs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="Seconds between member ticks.")
    session_timeout_s: float = Field(
        default=20.0, gt=0, description="A member silent for longer is evicted and its shards reassigned."
    )
    join_grace_s: float | None = Field(
        default=None,
        ge=0,
        description="A new member assigns shards only after this long, so members starting together all "
        "register before anyone claims. Defaults to 0.8 x heartbeat_interval_s.",
    )
    drain_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="How long a run launched by a departed member may still commit before its shard is "
        "reassigned and its range launched again.",
    )
    run_mode: Literal["member", "shard"] = Field(
        default="member",
        description="member: one run per member tick over all its ready shards (fixed costs paid once per batch); "
        "shard: one run per shard range.",
    )
    max_records_per_run: int = Field(
        default=1_000_000,
        gt=0,
        description="Records one run reads at most. In member mode this budget is split across the member's "
        "shards in proportion to their backlog; Spark splits large ranges into partitions itself.",
    )
    min_backlog: int = Field(
        default=20_000,
        gt=0,
        description="Launch at once when this many records wait (across the member's ready shards in member "
        "mode, per shard in shard mode) ...",
    )
    max_wait_s: float = Field(
        default=15.0,
        ge=0,
        description="... or once a smaller backlog has waited this long: the latency target of a quiet stream, "
        "which keeps it from launching runs of a few records.",
    )
    carry_on_s: float = Field(
        default=0.0,
        ge=0,
        description="Member mode: for this long after it started, a run that committed takes its shards' next "
        "ranges in the same state write and reads them in the same Dagster run and Spark session, while its member "
        "still owns them and min_backlog records wait; 0: one wave of ranges per run.",
    )
    max_attempts: int = Field(default=3, gt=0, description="Runs of one range before the range is given up.")
    after_max_attempts: Literal["park", "dead_letter"] = Field(
        default="park",
        description="park: stop the shard until an operator unparks it; dead_letter: record the range and move on.",
    )
    seek: Literal["earliest", "latest", "timestamp"] = Field(
        default="earliest",
        description="Where a shard with no committed offset starts: its earliest offset, its end, or the first "
        "record at or after seek_timestamp_ms.",
    )
    seek_timestamp_ms: int | None = Field(
        default=None,
        ge=0,
        description="With seek='timestamp': epoch milliseconds; like Spark's startingTimestamp.",
    )
    on_data_loss: Literal["fail", "earliest"] = Field(
        default="fail",
        description="When committed offsets fell out of retention: fail (park the shard) or skip to the earliest "
        "available offset. Either way an event records the lost range.",
    )
    on_recreated: Literal["park", "earliest"] = Field(
        default="park",
        description="When a shard's log was deleted and created again (a Kafka topic recreated: a new topic id), "
        "its offsets count in a new log: park the shard until an operator resumes it (streamgroup unpark reads the "
        "new log from its first record, streamgroup reset starts it elsewhere), or read the new log from its first "
        "record at once. Either way an event names the old log's offsets that were not read, and ranges in flight "
        "over the old log are refused.",
    )

    @model_validator(mode="after")
    def _timeouts_fit(self) -> Self:
        if self.session_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"session_timeout_s ({self.session_timeout_s}) must be at least twice heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or one late tick evicts a healthy member"
            )
        return self

    @model_validator(mode="after")
    def _seek_fits(self) -> Self:
        if self.seek == "timestamp" and self.seek_timestamp_ms is None:
            raise ValueError("seek_timestamp_ms: required when seek is 'timestamp'")
        if self.seek != "timestamp" and self.seek_timestamp_ms is not None:
            raise ValueError(f"seek_timestamp_ms: only used with seek='timestamp', seek is {self.seek!r}")
        return self

    @property
    def grace_s(self) -> float:
        return 0.8 * self.heartbeat_interval_s if self.join_grace_s is None else self.join_grace_s
