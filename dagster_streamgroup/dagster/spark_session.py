"""The Spark resource of stream runs: dagster-pyspark's lazy session, on a local master or a Connect server.

The session is built on first use, so sensors (which never read data) and runs that fail before reading do
not pay a JVM start. A classic session listens on 127.0.0.1 only and runs its Python workers with this
interpreter (PySpark would otherwise pick ``python3`` from PATH, without our packages). A Connect session
(``remote="sc://host:port"``) gets only the user's ``spark_config`` and the string redaction of secret options
(``spark/redaction.py``): the server owns master and workers.
"""

from __future__ import annotations

import os
from typing import Any

from dagster import EnvVar, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import ConfigDict, Field, model_validator

from dagster_streamgroup.dagster.literal_secrets import refuse_literal_secrets
from dagster_streamgroup.spark.redaction import with_string_redaction
from dagster_streamgroup.spark.session import (
    connect_address,
    prepare_environment,
    session_conf,
    wait_for_connect_server,
)


class StreamSparkResource(LazyPySparkResource):
    """A lazily created Spark session: ``master`` (``local[*]`` by default) or a Spark Connect ``remote``."""

    model_config = ConfigDict(hide_input_in_errors=True)

    master: str = Field(default="local[*]", description="Spark master URL of a classic session.")
    remote: str | None = Field(
        default=None, description="A Spark Connect server (sc://host:port); when set, master is not used."
    )
    spark_config: dict[str, Any] = Field(default_factory=dict, description="Extra Spark properties.")
    connect_timeout_s: float = Field(
        default=60.0,
        ge=0,
        description="How long a run waits for the Spark Connect server to accept connections before it fails "
        "(a restart of the server takes about 20 s; the Connect client alone would retry for about 10 minutes).",
    )

    @model_validator(mode="before")
    @classmethod
    def _check_target(cls, data: Any) -> Any:
        # Before validation, where a dagster.EnvVar is still itself: one is checked by its value when its variable
        # is set as the definitions load, else once it resolves (in the run), never by its variable's name. A
        # Connect URL may carry a token, so EnvVar is the way to pass it.
        if not isinstance(data, dict):
            return data
        remote, master = data.get("remote"), data.get("master")
        field = "remote"
        if isinstance(remote, EnvVar):
            field = f"remote (from the environment variable {remote.env_var_name})"
            remote = os.environ.get(remote.env_var_name)
        if isinstance(remote, str):
            if not remote.startswith("sc://"):
                raise ValueError(f"{field}: must be a Spark Connect URL sc://host:port (it does not start with sc://)")
            connect_address(remote, field)
        if remote is None and isinstance(master, str) and not isinstance(master, EnvVar) and not master.strip():
            raise ValueError("master: must be a Spark master URL such as local[*]")
        return data

    def get_resource_definition(self) -> Any:
        """Dagster's definition of this resource, once its Connect URL holds no literal token (``literal_secrets``)."""
        refuse_literal_secrets(self, {}, ("remote",))
        return super().get_resource_definition()

    def effective_config(self) -> dict[str, Any]:
        if self.remote is not None:
            return {**with_string_redaction(dict(self.spark_config)), "spark.remote": self.remote}
        # On a cluster the driver's address is left to Spark: executors on other hosts must reach it.
        return session_conf(
            self.master, {"spark.sql.shuffle.partitions": "8", "spark.master": self.master, **self.spark_config}
        )

    def _init_session(self) -> None:
        if self._spark_session is None:
            from pyspark.sql import SparkSession

            prepare_environment()
            builder = SparkSession.builder
            if self.remote is not None:
                wait_for_connect_server(self.remote, self.connect_timeout_s)
                builder = builder.remote(self.remote)
                # The server shows each statement's plan (our sources' options included) in its UI and event
                # log: the session's string redaction hides the secret options there (spark/redaction.py).
                config = with_string_redaction(dict(self.spark_config))
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
