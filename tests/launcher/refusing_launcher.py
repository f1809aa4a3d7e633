"""A run launcher whose launches raise while a file exists: what a launcher calling an API (Kubernetes, ECS) does
when that API refuses, which no local launcher can be made to show. It is Dagster's ``DefaultRunLauncher``
otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from dagster import Field
from dagster._config.config_schema import UserConfigSchema
from dagster._core.launcher import LaunchRunContext
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._serdes import ConfigurableClassData


class RefusingRunLauncher(DefaultRunLauncher):
    def __init__(self, inst_data: ConfigurableClassData | None = None, refuse_file: str = "") -> None:
        super().__init__(inst_data=inst_data)
        self.refuse_file = Path(refuse_file)

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {"refuse_file": Field(str)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, **config_value)

    def launch_run(self, context: LaunchRunContext) -> None:
        if self.refuse_file.exists():
            raise RuntimeError("the launcher's API refused to create the run's worker")
        super().launch_run(context)
