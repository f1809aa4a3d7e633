"""The run tag that names a run's worker process, so any process on the host can check or stop it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dagster_streamgroup.launcher import process

WORKER_TAG = "streamgroup/run_worker"
"""JSON of ``RunWorker``, written before the worker is allowed to start the run (as Dagster's Docker launcher
tags the container before starting it): run monitoring never sees a started run without it."""


class RunWorker(BaseModel):
    """One run worker process: a child of a fork server, or spawned as ``dagster api execute_run``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    host: str
    boot_id: str
    pid: int
    start_ticks: int
    via: Literal["fork", "spawn"]
    server_pid: int | None = None
    """The fork server the worker was forked from (None when spawned)."""
    runs_before: int | None = None
    """Runs the worker ran before this one (None: a process started for this run)."""

    def tag(self) -> dict[str, str]:
        return {WORKER_TAG: self.model_dump_json(exclude_none=True)}

    def still_running_here(self) -> bool:
        """Whether this worker is known to be running: on this host, since its boot, with its PID still the
        process that started then. From another host (or after a reboot) it cannot be known: False."""
        if self.host != process.hostname() or self.boot_id != process.boot_id():
            return False
        return process.state(self.pid, self.start_ticks) is process.ProcessState.RUNNING

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> RunWorker | None:
        """The worker a run's tags name; None when the run has no (readable) worker tag."""
        raw = tags.get(WORKER_TAG)
        if raw is None:
            return None
        try:
            return cls.model_validate_json(raw)
        except ValidationError:
            return None
