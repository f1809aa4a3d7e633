"""The fork servers of one launcher: one per code location, replaced when its code changes or it dies."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dagster._core.origin import RepositoryPythonOrigin
from dagster._serdes import serialize_value

from dagster_streamgroup.launcher.client import ForkServerHandle, ForkServerUnavailableError
from dagster_streamgroup.launcher.fingerprint import Fingerprint
from dagster_streamgroup.launcher.protocol import Preload
from dagster_streamgroup.launcher.settings import LauncherSettings

START_ATTEMPTS = 3
EXIT_NOTICE_WAIT_S = 2.0


@dataclass(frozen=True)
class _FailedStart:
    reason: str
    at: float
    generation: str | None
    fingerprint: Fingerprint


@dataclass(frozen=True)
class Lease:
    server: ForkServerHandle
    replaced_because: str | None
    """Why the previous server of this code location was retired for this run (None: it served, or none ran)."""


class ServerPool:
    def __init__(self, settings: LauncherSettings) -> None:
        self.settings = settings
        self._servers: dict[str, ForkServerHandle] = {}
        self._failed: dict[str, _FailedStart] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.retired_exits: dict[int, int] = {}

    def lease(
        self,
        origin: RepositoryPythonOrigin,
        location_name: str | None,
        generation: str | None,
        instance_ref: str | None,
        force_restart: str | None = None,
    ) -> Lease:
        """A ready server for ``origin``'s current code; raises ``ForkServerUnavailableError`` with the reason
        when none can serve. ``generation`` is the code server's id: a reloaded code location has a new one."""
        key = serialize_value(origin)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            server = self._servers.get(key)
            reason = force_restart
            if server is not None and reason is None:
                reason = _why_retire(server, generation)
            if server is not None and reason is None:
                return Lease(server, None)
            if server is not None:
                self._retire(key)
            failed = self._failed.get(key)
            if (
                failed is not None
                and failed.generation == generation
                and time.monotonic() - failed.at < self.settings.retry_failed_preload_seconds
                and not failed.fingerprint.changed()
            ):
                raise ForkServerUnavailableError(failed.reason)
            preload = Preload(
                repository_origin=key,
                location_name=location_name,
                instance_ref=instance_ref,
                modules=self.settings.preload_modules,
                runs_per_worker=self.settings.runs_per_worker,
                worker_idle_s=self.settings.worker_idle_seconds,
            )
            try:
                server = self._start(preload, origin.executable_path, generation)
            except ForkServerUnavailableError as exc:
                message = f"{reason}; a new one could not start: {exc}" if reason else str(exc)
                self._failed[key] = _FailedStart(message, time.monotonic(), generation, exc.fingerprint)
                raise ForkServerUnavailableError(message) from exc
            self._failed.pop(key, None)
            self._servers[key] = server
            return Lease(server, reason)

    def _start(self, preload: Preload, executable: str, generation: str | None) -> ForkServerHandle:
        """A server whose code did not change while it loaded it (a file saved during an edit, or a checkout
        in progress); after ``START_ATTEMPTS`` servers that each saw a change, none."""
        for _ in range(START_ATTEMPTS):
            server = ForkServerHandle.start(preload, executable, generation, self.settings.start_timeout_seconds)
            changed = server.ready.fingerprint.changed()
            if not changed:
                return server
            server.close()
        raise ForkServerUnavailableError(
            f"its code kept changing while fork servers loaded it ({_shown(changed)})", server.ready.fingerprint
        )

    def _retire(self, key: str) -> None:
        server = self._servers.pop(key)
        server.close()
        self.retired_exits.update(server.exits)

    def exit_status(self, pid: int, server_pid: int, wait_s: float = EXIT_NOTICE_WAIT_S) -> int | None:
        """How a child of server ``server_pid`` ended, if that server is one of these and waited for it (it
        reports an exit within milliseconds; ``wait_s`` covers a loaded host)."""
        server = next((s for s in list(self._servers.values()) if s.pid == server_pid), None)
        if server is None:
            return self.retired_exits.get(pid)
        deadline = time.monotonic() + wait_s
        while True:
            server.collect_exits(timeout_s=0.1)
            if pid in server.exits:
                return server.exits[pid]
            if time.monotonic() > deadline or not server.alive():
                return None

    def servers(self) -> list[ForkServerHandle]:
        return list(self._servers.values())

    def close(self) -> None:
        with self._guard:
            keys = list(self._servers)
        for key in keys:
            self._retire(key)


def _why_retire(server: ForkServerHandle, generation: str | None) -> str | None:
    if not server.alive():
        return f"its fork server (pid {server.pid}) had exited with {server.proc.returncode}"
    if server.generation != generation:
        return "the code location was reloaded since its fork server started"
    changed = server.ready.fingerprint.changed()
    if changed:
        return f"its code changed since its fork server started ({_shown(changed)})"
    return None


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
