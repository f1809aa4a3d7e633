"""The launcher's settings (the ``config:`` block under ``run_launcher`` in dagster.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_PRELOAD_MODULES = (
    "pandas",
    "pyarrow",
    "confluent_kafka",
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.functions",
    "pyspark.sql.datasource",
    "dagster_streamgroup.spark.kafka_source",
    "dagster_streamgroup.spark.v3io_source",
    "dagster_streamgroup.stores.sql_log",
    "dagster_streamgroup.stores.v3io_log",
    "dagster._core.storage.local_compute_log_manager",
    "dagster_streamgroup.compute_logs",
    "dagster._core.instance.factory",
    "dagster._core.system_config.composite_descent",
    "pyspark.sql.connect.datasource",
    "upath.implementations.local",
    "dagster_streamgroup.spark.kafka_read",
    "dagster_streamgroup.spark.record_counts",
    "dagster_streamgroup.spark.spark_kafka_source",
    "dagster_streamgroup.coordinator",
    "dagster._core.storage.root",
    "dagster._core.executor.in_process",
    "dagster._core.execution.plan.active",
)
"""What a stream run imports besides dagster and the definitions: the Spark Connect client (which brings
grpc), pandas/pyarrow (Arrow batches), confluent-kafka, this package's Spark sources, readers and state stores
(imported when a run first reads or commits), the run coordinator the instance names, and what Dagster imports
as it executes a step and captures its logs. Modules that are not installed are skipped."""


class LauncherSettingsError(ValueError):
    """A bad ``run_launcher.config`` value; the message names the field and the reason."""


class LauncherSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    preload_modules: tuple[str, ...] = Field(
        default=DEFAULT_PRELOAD_MODULES,
        description="Modules the fork server imports before it forks, besides dagster and the code location "
        "(which it always loads). Each one imported here is a cost no run pays again.",
    )
    start_timeout_seconds: float = Field(
        default=180.0,
        gt=0,
        description="How long a fork server may take to import and load the code location before the run "
        "is spawned the default way instead.",
    )
    retry_failed_preload_seconds: float = Field(
        default=60.0,
        ge=0,
        description="After a failed preload, runs of that code location are spawned without trying again "
        "for this long, unless its files change first.",
    )
    runs_per_worker: int = Field(
        default=1,
        ge=1,
        description="How many runs one forked worker may run one after another. 1 (the default) is Dagster's "
        "model: a new process per run. Above 1, a worker whose run succeeded waits for the next run of its "
        "code location instead of exiting, so that run skips the fork and the copy of the server's memory "
        "that a new process writes to; a failed, canceled or interrupted run's worker still exits.",
    )
    worker_idle_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long a worker that may take another run waits for one before it exits (with "
        "runs_per_worker above 1).",
    )

    @field_validator("preload_modules")
    @classmethod
    def _module_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not name or not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"{name!r} is not a dotted module name")
        return value

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LauncherSettings:
        try:
            return cls.model_validate(dict(config))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or 'config'}: {error['msg']}" for error in exc.errors()
            )
            raise LauncherSettingsError(f"run_launcher.config of ForkServerRunLauncher: {problems}") from None
