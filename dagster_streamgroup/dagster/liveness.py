"""A run's heartbeat: while it executes, it says so in the group state, three times per session timeout.

A member that departs leaves its runs in flight to drain: they may still commit. Whether they can is only
known to the run itself, so it says it is alive; once it stops (its process was killed, its deployment lost),
the group relaunches its ranges after a session timeout instead of waiting out the whole drain timeout. That
judgement needs no finer clock than the session timeout, and each beat is a state write.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import TracebackType

from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import RangeReport

log = logging.getLogger(__name__)


def run_beat_interval_s(heartbeat_interval_s: float, session_timeout_s: float) -> float:
    """A third of the session timeout (a run survives two beats lost to a store hiccup), never more often than
    the member's own heartbeat."""
    return max(heartbeat_interval_s, session_timeout_s / 3)


class RunHeartbeat:
    """Context manager: ``touch`` the run's ranges now and every ``interval_s`` until the block ends."""

    def __init__(self, member: GroupMember, reports: Sequence[RangeReport], interval_s: float) -> None:
        self._member = member
        self._reports = list(reports)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="streamgroup-run-heartbeat", daemon=True)

    def follow(self, reports: Sequence[RangeReport]) -> None:
        """The run carried on with ``reports``: touch those from now on (the previous ones are committed)."""
        self._reports = list(reports)

    def _touch(self) -> None:
        try:
            self._member.touch_run(self._reports)
        except Exception as exc:  # a store hiccup must not fail the run: the next beat tries again
            log.warning("the run could not say it is alive: %s", exc)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._touch()

    def __enter__(self) -> RunHeartbeat:
        self._touch()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval_s + 5)
