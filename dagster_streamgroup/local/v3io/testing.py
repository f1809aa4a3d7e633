"""Start the v3io-compatible server as a subprocess on a free 127.0.0.1 port, for tests, benchmarks and examples.

The server is the real ``streamgroup local v3io`` command; it is stopped by its PID (SIGTERM, then
SIGKILL after a grace period), and :meth:`V3ioServerProcess.restart` brings it back on the same data
directory and port, optionally after a crash (SIGKILL), for durability tests.
"""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class V3ioServerInfo:
    endpoint: str
    """``http://127.0.0.1:<port>``, what ``v3io.dataplane.Client(endpoint=...)`` takes."""
    access_key: SecretStr
    """The key clients should send (the required one, or a random one when any key passes)."""
    pid: int
    port: int
    data_dir: Path = field(repr=True)

    def client_kwargs(self) -> dict[str, str]:
        """``endpoint`` and ``access_key`` for the v3io clients."""
        return {"endpoint": self.endpoint, "access_key": self.access_key.get_secret_value()}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class V3ioServerProcess:
    """One server subprocess over one data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        access_key: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self._required_key = access_key
        self._client_key = SecretStr(access_key or secrets.token_hex(16))
        self._env = dict(env or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = self.data_dir / "server.log"

    @property
    def info(self) -> V3ioServerInfo:
        if self._process is None or self.port is None:
            raise RuntimeError("the v3io server is not running")
        return V3ioServerInfo(
            f"http://127.0.0.1:{self.port}", self._client_key, self._process.pid, self.port, self.data_dir
        )

    def start(self) -> V3ioServerInfo:
        if self._process is not None:
            raise RuntimeError("the v3io server is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fixed = self.port is not None
        for _attempt in range(1 if fixed else 3):
            port = self.port if self.port is not None else free_port()
            if self._spawn(port):
                self.port = port
                return self.info
        raise RuntimeError(f"the v3io server did not start; see {self._log_path}:\n{self._log_tail()}")

    def _spawn(self, port: int) -> bool:
        env = {**os.environ, **self._env}
        env.pop("STREAMGROUP_V3IO_ACCESS_KEY", None)
        if self._required_key:
            env["STREAMGROUP_V3IO_ACCESS_KEY"] = self._required_key
        command = [
            sys.executable,
            "-m",
            "dagster_streamgroup.cli",
            "local",
            "v3io",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data",
            str(self.data_dir),
        ]
        with open(self._log_path, "ab") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            if self._answers(port):
                self._process = process
                return True
            time.sleep(0.05)
        _stop(process)
        return False

    def _answers(self, port: int) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            connection.request("GET", "/", headers={"X-v3io-session-key": self._client_key.get_secret_value()})
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def _log_tail(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Graceful stop by PID (SIGTERM), SIGKILL if it does not exit in time."""
        if self._process is not None:
            _stop(self._process)
            self._process = None

    def kill(self) -> None:
        """Crash the server (SIGKILL by PID): what a durability test needs."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=STOP_TIMEOUT_S)
            self._process = None

    def restart(self, *, crash: bool = False) -> V3ioServerInfo:
        """Stop (or crash) and start again on the same data directory and port."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)


@contextmanager
def running_v3io_server(
    data_dir: Path, *, port: int | None = None, access_key: str | None = None
) -> Iterator[V3ioServerInfo]:
    """A running server for the ``with`` block; stopped by PID on exit, also when the block raises."""
    server = V3ioServerProcess(data_dir, port=port, access_key=access_key)
    try:
        yield server.start()
    finally:
        server.stop()
