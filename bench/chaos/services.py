"""The servers of the chaos deployment, each one killable with SIGKILL and restartable on the same address.

The project's launchers (``local.postgres``, ``local.kafka_broker``) start a server for the life of a
``with`` block; a chaos run needs the same server back, on the same port and with the same data, after
SIGKILLing it, because the deployment's configuration (the store URL, the bootstrap address) names it.

- ``RestartablePostgres``: the group state's store. ``initdb`` once; each start runs crash recovery on the
  same data directory (``fsync`` on, as in production).
- The broker is ``local.kafka_broker.LocalKafka`` itself: Apache Kafka on a data directory and fixed ports,
  so a SIGKILLed broker recovers its logs on restart and comes back with everything it had acknowledged.

Every process is started in a session of its own, so a kill reaches its whole tree, and stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from dagster_streamgroup.local.kafka_broker import free_port
from dagster_streamgroup.local.postgres import PostgresStartError, find_server_binaries


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the session (process group) a server was started in: the server and every child it forked."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _reap(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)


def _wait_group_gone(pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


class RestartablePostgres:
    """A PostgreSQL server on a fixed 127.0.0.1 port, killed and started again on its data. Its directory is
    a temporary directory of its own (the server's user must reach it when we run as root), deleted by
    ``stop``."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.password = secrets.token_urlsafe(18)
        self.bindir = find_server_binaries()
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_as: tuple[int, int] | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            import pwd

            entry = pwd.getpwnam("postgres")
            self.run_as = (entry.pw_uid, entry.pw_gid)

    @property
    def url(self) -> str:
        """The state store URL (SQLAlchemy, psycopg 3)."""
        return f"postgresql+psycopg://streamgroup:{self.password}@127.0.0.1:{self.port}/streamgroup"

    def _user(self) -> dict[str, object]:
        if self.run_as is None:
            return {}
        return {"user": self.run_as[0], "group": self.run_as[1], "extra_groups": []}

    def init(self) -> None:
        self.sockets.mkdir(exist_ok=True)
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.run_as is not None:
            for path in (self.root, self.sockets, pwfile):
                os.chown(path, *self.run_as)
        command = [
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "streamgroup", "--auth=scram-sha-256",
            f"--pwfile={pwfile}", "--encoding=UTF8", "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=self.root, env={**os.environ, "LC_ALL": "C", "LANG": "C"}, capture_output=True,
            text=True, check=False, timeout=180, **self._user(),  # type: ignore[call-overload]
        )  # fmt: skip
        pwfile.unlink()
        if done.returncode != 0:
            raise PostgresStartError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.start()
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE streamgroup")

    def _dsn(self, database: str = "streamgroup") -> str:
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, user="streamgroup", password=self.password, dbname=database,
            connect_timeout=3,
        )  # fmt: skip

    def start(self, timeout_s: float = 120.0) -> None:
        settings = ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.sockets}"]
        settings += ["-c", "max_connections=200", "-c", "shared_buffers=32MB"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), *settings],
                cwd=self.root, env={**os.environ, "LC_ALL": "C", "LANG": "C"}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, **self._user(),  # type: ignore[call-overload]
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresStartError(f"postgres exited with {self.proc.returncode}; see {self.log}")
            try:
                with psycopg.connect(self._dsn("postgres")):
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise PostgresStartError(f"postgres did not accept connections within {timeout_s:.0f} s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend: the next start runs crash recovery."""
        if self.proc is None:
            return
        kill_group(self.proc.pid)
        _reap(self.proc)
        _wait_group_gone(self.proc.pid)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        kill_group(self.proc.pid, signal.SIGINT)  # fast shutdown
        _reap(self.proc)
        self.kill()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
