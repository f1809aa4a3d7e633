"""Dagster's SQLite event log storage, with the first materialization it stores held until a gate opens.

It shows whether a carrying run reads its next wave while the previous wave's materializations are being
stored: the gate is opened by the stream function's call for the next wave. Storing stays Dagster's own; only
the wait is added, because real storage cannot be made slow on demand.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._serdes import ConfigurableClassData

GATE_WAIT_S = 60.0


class GatedEventLogStorage(SqliteEventLogStorage):
    gate: ClassVar[threading.Event] = threading.Event()
    opened_in_time: ClassVar[list[bool]] = []
    """Whether the gate opened while the first materialization waited for it (one entry once that happened)."""

    @classmethod
    def reset(cls) -> None:
        cls.gate = threading.Event()
        cls.opened_in_time = []

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> GatedEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def store_event(self, event: EventLogEntry) -> None:
        dagster_event = event.dagster_event
        if dagster_event is not None and dagster_event.is_step_materialization and not self.opened_in_time:
            type(self).opened_in_time.append(self.gate.wait(GATE_WAIT_S))
        super().store_event(event)


def gated_instance_overrides(base_dir: str) -> dict[str, Any]:
    """``dg.instance_for_test(overrides=...)`` for an instance that stores its events here."""
    return {
        "event_log_storage": {
            "module": __name__,
            "class": GatedEventLogStorage.__name__,
            "config": {"base_dir": base_dir},
        }
    }
