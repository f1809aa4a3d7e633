"""The chaos deployment's settings: ``CHAOS_*`` variables, which ``bench.chaos`` sets for ``dagster dev``.

Kept apart from ``definitions.py`` (which reads them when the code location loads) so the driver can name them
without loading the code location."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ASSET = "chaos_ranges"
SECOND_ASSET = "chaos_second_ranges"
"""The asset of the second group that shares the code location (``two_groups``)."""
SECOND_RESOURCE = "streamgroup_second"
STORE_URL_ENV = "CHAOS_STORE_URL"


class ChaosSettings(BaseModel):
    """The deployment's settings; each field is the variable ``CHAOS_<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    group: str = Field(min_length=1)
    spark_remote: str = Field(pattern=r"^sc://")
    work_dir: Path
    members: int = Field(default=3, ge=1)
    heartbeat_s: float = Field(default=5.0, ge=1)
    session_timeout_s: float = Field(default=20.0, gt=0)
    drain_timeout_s: float = Field(default=40.0, gt=0)
    max_records_per_run: int = Field(default=200_000, ge=1)
    min_backlog: int = Field(default=5_000, ge=1)
    max_wait_s: float = Field(default=5.0, ge=0)
    max_attempts: int = Field(default=2, ge=1)
    after_max_attempts: str = Field(default="park", pattern=r"^(park|dead_letter)$")
    carry_on_s: float = Field(default=0.0, ge=0)
    second_topic: str | None = None
    """The second group's topic: with ``second_group``, the code location holds a second stream asset and its
    member sensors, which run beside the main group's through the whole chaos run."""
    second_group: str | None = None
    second_members: int = Field(default=2, ge=1)
    sink_topic: str | None = None
    """With it, the main group's runs also commit their records into the Delta table ``work_dir/sink-delta`` and
    this Kafka topic (``dagster_streamgroup.sinks``), before their state commit; the check counts every record in
    each."""


def settings_from_env(env: dict[str, str] | None = None) -> ChaosSettings:
    source = os.environ if env is None else env
    raw = {
        name: source[f"CHAOS_{name.upper()}"]
        for name in ChaosSettings.model_fields
        if source.get(f"CHAOS_{name.upper()}", "").strip()
    }
    try:
        return ChaosSettings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"CHAOS_{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise ValueError(f"chaos deployment settings: {problems}") from None
