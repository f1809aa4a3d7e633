"""The Spark resource of stream runs: dagster-pyspark's lazy session, on a local master or a Connect server.

The session is built on first use, so sensors (which never read data) and runs that fail before reading do
not pay a JVM start. A classic session listens on 127.0.0.1 only and runs its Python workers with this
interpreter (PySpark would otherwise pick ``python3`` from PATH, without our packages). A Connect session
(``remote="sc://host:port"``) gets only the user's ``spark_config``: the server owns master and workers.
"""

from __future__ import annotations

from typing import Any

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import ConfigDict, Field, model_validator

from dagster_streamgroup.spark.session import LOCAL_CONF, prepare_environment, with_arrow_java_options

LOCAL_DEFAULTS: dict[str, str] = {**LOCAL_CONF, "spark.sql.shuffle.partitions": "8"}


class StreamSparkResource(LazyPySparkResource):
    """A lazily created Spark session: ``master`` (``local[*]`` by default) or a Spark Connect ``remote``."""

    model_config = ConfigDict(hide_input_in_errors=True)

    master: str = Field(default="local[*]", description="Spark master URL of a classic session.")
    remote: str | None = Field(
        default=None, description="A Spark Connect server (sc://host:port); when set, master is not used."
    )
    spark_config: dict[str, Any] = Field(default_factory=dict, description="Extra Spark properties.")

    @model_validator(mode="after")
    def _check_target(self) -> StreamSparkResource:
        if self.remote is not None and not str(self.remote).startswith("sc://"):
            raise ValueError(f"remote: must be a Spark Connect URL sc://host:port, got {self.remote!r}")
        if self.remote is None and not str(self.master).strip():
            raise ValueError("master: must be a Spark master URL such as local[*]")
        return self

    def effective_config(self) -> dict[str, Any]:
        if self.remote is not None:
            return {**self.spark_config, "spark.remote": self.remote}
        return with_arrow_java_options({**LOCAL_DEFAULTS, "spark.master": self.master, **self.spark_config})

    def _init_session(self) -> None:
        if self._spark_session is None:
            from pyspark.sql import SparkSession

            prepare_environment()
            builder = SparkSession.builder
            if self.remote is not None:
                builder = builder.remote(self.remote)
                config = dict(self.spark_config)
            else:
                config = self.effective_config()
            for key, value in config.items():
                builder = builder.config(key, value)
            self._spark_session = builder.getOrCreate()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """A Connect session is released when the run ends. Left open, the client's exit hook would release it
        when the process exits, retrying for minutes if the server is gone by then (restarted, stopped), and
        the run process would hang; released here, the server frees the session's state at once. A classic
        session dies with its process."""
        if self.remote is not None and self._spark_session is not None:
            session, self._spark_session = self._spark_session, None
            session.stop()

    @property
    def is_connect(self) -> bool:
        return self.remote is not None
