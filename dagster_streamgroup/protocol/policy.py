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
    max_records_per_run: int = Field(default=100_000, gt=0, description="Upper bound of one range.")
    min_backlog: int = Field(default=1, gt=0, description="Launch once this many records wait ...")
    max_wait_s: float = Field(default=60.0, ge=0, description="... or once a smaller backlog waited this long.")
    max_attempts: int = Field(default=3, gt=0, description="Runs of one range before the range is given up.")
    after_max_attempts: Literal["park", "dead_letter"] = Field(
        default="park",
        description="park: stop the shard until an operator unparks it; dead_letter: record the range and move on.",
    )
    seek: Literal["earliest", "latest"] = Field(
        default="earliest", description="Where a shard with no committed offset starts."
    )
    on_data_loss: Literal["fail", "earliest"] = Field(
        default="fail",
        description="When committed offsets fell out of retention: fail (park the shard) or skip to the earliest "
        "available offset. Either way an event records the lost range.",
    )

    @model_validator(mode="after")
    def _timeouts_fit(self) -> Self:
        if self.session_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"session_timeout_s ({self.session_timeout_s}) must be at least twice heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or one late tick evicts a healthy member"
            )
        return self

    @property
    def grace_s(self) -> float:
        return 0.8 * self.heartbeat_interval_s if self.join_grace_s is None else self.join_grace_s
