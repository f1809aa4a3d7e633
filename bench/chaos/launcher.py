"""The chaos deployment's run launcher: the project's ``ForkServerRunLauncher``, whose launches raise while a file
exists (``launcher_outage``).

What a launcher that calls an API (Kubernetes, ECS) does while that API refuses, which no local launcher shows by
itself. The file is the switch because every process that launches runs (the daemon's sensors and queue, the
webserver) builds its own launcher from ``dagster.yaml``: a file is seen by all of them at once. Each refusal is
appended to ``launches-refused.jsonl`` next to the file (the run, its group, member, run key and ranges with
their attempts), so the fault can follow each refused range: relaunched under a new run key without counting an
attempt (``protocol.launch_failed``), never parked or dead-lettered for it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from dagster import Field
from dagster._config.config_schema import UserConfigSchema
from dagster._core.launcher import LaunchRunContext
from dagster._serdes import ConfigurableClassData
from pydantic import BaseModel, ConfigDict

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.launcher import ForkServerRunLauncher

REFUSED_LOG = "launches-refused.jsonl"


class LauncherOutageError(RuntimeError):
    """A launch refused by the chaos run's launcher outage. Its name is what the run's
    ``streamgroup/launch_failed`` tag holds."""


class RefusedRange(BaseModel):
    model_config = ConfigDict(frozen=True)

    shard: str
    start: int
    end: int
    attempt: int
    epoch: int


class RefusedLaunch(BaseModel):
    """One launch the outage refused."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    group: str | None
    member: str | None
    run_key: str | None
    ranges: tuple[RefusedRange, ...]
    at: float


class OutageRunLauncher(ForkServerRunLauncher):
    """``ForkServerRunLauncher`` that raises ``LauncherOutageError`` instead of launching while ``outage_file``
    exists. The parent's ``launch_run`` tags the refused run ``streamgroup/launch_failed`` as for any launch that
    raised."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, outage_file: str = "", **config: Any) -> None:
        super().__init__(inst_data, **config)
        self.outage_file = Path(outage_file) if outage_file else None

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        schema = super().config_type()
        assert isinstance(schema, dict)
        return {**schema, "outage_file": Field(str, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, **config_value)

    def _launch_run(self, context: LaunchRunContext) -> None:
        if self.outage_file is not None and self.outage_file.exists():
            refused = refused_launch(
                context.dagster_run.run_id, context.dagster_run.tags, context.dagster_run.run_config
            )
            with (self.outage_file.parent / REFUSED_LOG).open("a") as log:
                log.write(refused.model_dump_json() + "\n")
            raise LauncherOutageError(f"the chaos run's launcher outage refused run {refused.run_id}")
        super()._launch_run(context)


def refused_launch(run_id: str, tags: Mapping[str, str], run_config: Mapping[str, Any]) -> RefusedLaunch:
    """The refused run as the fault follows it: its group and member from its tags, its run key and ranges from its
    op config."""
    ranges: list[RefusedRange] = []
    run_key: str | None = tags.get(sgt.TAG_RUN_KEY)  # runs launched before the run key left the tags
    for op in (run_config.get("ops") or {}).values():
        run_key = ((op or {}).get("config") or {}).get("run_key") or run_key
        for r in ((op or {}).get("config") or {}).get("ranges") or []:
            ranges.append(
                RefusedRange(
                    shard=r["shard"],
                    start=r["start"],
                    end=r["end"],
                    attempt=r.get("attempt", 0),
                    epoch=r.get("epoch", 0),
                )
            )
    return RefusedLaunch(
        run_id=run_id,
        group=tags.get(sgt.TAG_GROUP),
        member=tags.get(sgt.TAG_MEMBER),
        run_key=run_key,
        ranges=tuple(ranges),
        at=time.time(),
    )


def read_refused(folder: Path) -> list[RefusedLaunch]:
    path = folder / REFUSED_LOG
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(RefusedLaunch.model_validate_json(line))
        except ValueError:
            continue  # a line being written
    return out
