"""Messages between a launcher and its fork server: one JSON object a line over a Unix socket pair.

The socket pair is also the server's lifeline: when the launcher's process ends, for any reason (a SIGKILL
included), the kernel closes its end and the server reads end-of-file and exits. Runs it already released
keep running.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dagster_streamgroup.launcher.fingerprint import Fingerprint


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)


class Preload(_Message):
    """Import what the runs of one code location import, then serve forks."""

    type: Literal["preload"] = "preload"
    repository_origin: str
    """Dagster-serialized ``RepositoryPythonOrigin``: the code is loaded as a run worker loads it."""
    location_name: str | None
    instance_ref: str | None
    """Dagster-serialized ``InstanceRef``; only its secrets loader is used (the env vars the code server and
    ``execute_run`` inject). No storage is opened: nothing the children inherit talks to a database."""
    modules: tuple[str, ...]
    runs_per_worker: int = 1
    """How many runs a child may run one after another (``LauncherSettings.runs_per_worker``)."""
    worker_idle_s: float = 60.0
    """How long a child that may run another run waits for one before the server lets it exit."""


class Fork(_Message):
    type: Literal["fork"] = "fork"
    run_id: str
    execute_run_args: str
    """Dagster-serialized ``ExecuteRunArgs``: the child runs ``dagster api execute_run`` with it."""


class Release(_Message):
    """Let a forked child start its run (``start``), or make it exit without touching the run."""

    type: Literal["release"] = "release"
    pid: int
    start: bool


class Ready(_Message):
    type: Literal["ready"] = "ready"
    pid: int
    fingerprint: Fingerprint
    preload_s: float
    preload_cpu_s: float
    modules_loaded: int
    missing_modules: tuple[str, ...]
    """Modules of ``Preload.modules`` that are not installed (skipped, not an error)."""


class PreloadFailed(_Message):
    type: Literal["preload_failed"] = "preload_failed"
    error: str
    fingerprint: Fingerprint


class Forked(_Message):
    type: Literal["forked"] = "forked"
    pid: int
    start_ticks: int
    runs_before: int = 0
    """Runs this child ran before this one (0: forked for this run)."""


class Refused(_Message):
    """The server cannot fork safely (for example, a thread is running), or a request was malformed."""

    type: Literal["refused"] = "refused"
    reason: str


class Released(_Message):
    type: Literal["released"] = "released"
    pid: int


class Exited(_Message):
    """A child was waited for: ``status`` is its exit code, or minus the signal that ended it."""

    type: Literal["exited"] = "exited"
    pid: int
    status: int


Message = Annotated[
    Preload | Fork | Release | Ready | PreloadFailed | Forked | Refused | Released | Exited,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


class ChannelClosedError(ConnectionError):
    """The other end of the channel is gone (its process exited or closed it)."""


class Channel:
    """Newline-delimited messages over a stream socket, with timeouts on reads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, message: _Message) -> None:
        try:
            self.sock.sendall(message.model_dump_json().encode() + b"\n")
        except OSError as exc:
            raise ChannelClosedError(f"sending {message.__class__.__name__}: {exc}") from exc

    def pending(self) -> bool:
        """Whether a whole message is buffered already."""
        return b"\n" in self._buffer

    def recv(self, timeout_s: float | None) -> Message | None:
        """The next message; None if none came within ``timeout_s`` (None waits without a limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.sock], [], [], wait)
            if not readable:
                return None
            try:
                chunk = self.sock.recv(65536)
            except OSError as exc:
                raise ChannelClosedError(str(exc)) from exc
            if not chunk:
                raise ChannelClosedError("end of file")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return _ADAPTER.validate_json(line)

    def close(self) -> None:
        self.sock.close()
