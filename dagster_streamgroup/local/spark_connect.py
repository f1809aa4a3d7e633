"""A local Spark Connect server that Dagster runs attach to instead of each starting a JVM.

A classic local Spark session costs a run ~10 s (JVM start and first job). A long-lived Connect server on
127.0.0.1 lets each run attach in well under a second. Three things make that hold over many runs:

- the server runs ``spark_connect_server`` (the Connect plugin in a driver whose sessions share one set of
  Python workers; see that module for why ``start-connect-server.sh`` leaks ~400 MiB per run);
- a warm-up run (session + one Python Data Source read) at start, so the first real run does not pay the
  cold JVM and the Python daemons' start;
- a memory guard: when the server tree's RSS passes a limit, it is restarted on the same port, but only when
  no client is connected, so no run loses its session.

Everything it starts listens on 127.0.0.1 only and is stopped by PID (its process group included).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dagster_streamgroup.local import procfs

HOST = "127.0.0.1"
DEFAULT_PORT = 15002
_LOG_NAME = "server.log"
_CLIENT_ENV_TO_DROP = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "PYSPARK_SUBMIT_ARGS")


class ConnectServerSettings(BaseModel):
    """How the local server runs. Validation errors name the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field(default="local[2]", min_length=1, description="Spark master of the server's driver.")
    driver_memory: str = Field(
        default="2g", pattern=r"^[0-9]+[kKmMgGtT]?$", description="JVM heap of the driver, e.g. 2g."
    )
    isolate_sessions: bool = Field(
        default=False,
        description="Spark's default: every session gets its own artifacts and its own Python daemons "
        "(slow first read per run, ~400 MiB kept per run). Off shares them between sessions.",
    )
    rss_limit_mb: int | None = Field(
        default=4096, gt=0, description="Restart the server when its process tree's RSS passes this (None: never)."
    )
    check_interval_s: float = Field(default=10.0, gt=0, description="How often the memory guard looks.")
    warm_up: bool = Field(default=True, description="Run one session + Python Data Source read at start.")
    start_timeout_s: float = Field(default=180.0, gt=0, description="Budget for the port to answer and warm-up.")
    stop_timeout_s: float = Field(default=30.0, gt=0, description="Grace period before the server is killed.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark conf, passed through untouched.")


@dataclass(frozen=True)
class ConnectServerInfo:
    remote: str
    """``sc://127.0.0.1:PORT``: what ``SparkSession.builder.remote(...)`` (or ``SPARK_REMOTE``) takes."""
    port: int
    pid: int
    """The server process we started (the Python driver; its JVM and workers are its descendants)."""
    log_path: Path


class ConnectServerStartError(RuntimeError):
    """The server did not come up or its warm-up failed; the message carries the tail of its log."""


def needs_restart(rss_mb: float, limit_mb: int | None, connections: int) -> bool:
    """The memory guard's rule: over the limit and nobody connected (a restart between runs loses nothing)."""
    return limit_mb is not None and rss_mb > limit_mb and connections == 0


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def spark_home() -> Path:
    """The installed pyspark package: it carries Spark's jars, ``bin/`` and ``sbin/``."""
    import pyspark

    return Path(pyspark.__file__).parent


def server_environment() -> dict[str, str]:
    """This environment, with the server's Python workers pinned to this interpreter (so they import this
    package, pyarrow and confluent-kafka) and client-mode switches removed (they would turn the server's own
    driver into a Connect client)."""
    env = {key: value for key, value in os.environ.items() if key not in _CLIENT_ENV_TO_DROP}
    env.update(SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP=HOST)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return env


def server_command(port: int, settings: ConnectServerSettings, local_dir: Path | None = None) -> list[str]:
    command = [
        sys.executable, "-m", "dagster_streamgroup.local.spark_connect_server",
        "--port", str(port),
        "--master", settings.master,
        "--driver-memory", settings.driver_memory,
    ]  # fmt: skip
    if settings.isolate_sessions:
        command.append("--isolate-sessions")
    if local_dir is not None:
        command += ["--local-dir", str(local_dir)]
    for key, value in settings.conf.items():
        command += ["--conf", f"{key}={value}"]
    return command


def port_answers(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def stop_process_tree(pid: int, timeout_s: float = 30.0) -> None:
    """Stop a server we started: SIGTERM to ``pid`` (it stops Spark cleanly), SIGKILL if it lingers, then
    SIGKILL whatever is left of its process tree and process group (its JVM and Python daemons)."""
    tree = procfs.process_tree(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and procfs.alive([pid]):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    for other in procfs.alive(tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(other, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the group we created for it: anything forked after the snapshot
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and procfs.alive(tree):
        time.sleep(0.05)


def run_probe(remote: str, timeout_s: float, rows: int = 1000) -> dict[str, Any]:
    """One probe run (session + Python Data Source read) in a new process, as a Dagster run would be."""
    command = [
        sys.executable, "-m", "dagster_streamgroup.local.spark_probe", "--remote", remote, "--rows", str(rows)
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        tail = said.strip()[-2000:]
        raise RuntimeError(f"probe run did not finish within {timeout_s:.0f} s; its stderr: {tail}") from None
    last = done.stdout.strip().splitlines()[-1:] or [""]
    if done.returncode != 0:
        raise RuntimeError(f"probe run failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
    result: dict[str, Any] = json.loads(last[0])
    return result


class ConnectServer:
    """One local server and its memory guard. ``remote`` stays the same across restarts; ``pid`` changes."""

    def __init__(self, port: int, settings: ConnectServerSettings, scratch: Path) -> None:
        self.port = port
        self.settings = settings
        self.scratch = scratch
        self.log_path = scratch / _LOG_NAME
        self.restarts = 0
        self.warm_up_result: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self._guard_stop = threading.Event()
        self._guard: threading.Thread | None = None

    @property
    def remote(self) -> str:
        return f"sc://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the server is not running")
        return self._proc.pid

    @property
    def info(self) -> ConnectServerInfo:
        return ConnectServerInfo(remote=self.remote, port=self.port, pid=self.pid, log_path=self.log_path)

    def rss_mb(self) -> float:
        """RSS summed over the server's process tree (driver, JVM, Python daemons and workers), in MiB."""
        return procfs.tree_rss_bytes(self.pid) / 2**20

    def active_connections(self) -> int:
        return procfs.established_connections(self.port)

    def start(self) -> None:
        """Start the server and block until its port answers and the warm-up run has read through it."""
        with self._lock:
            if self._proc is not None:
                raise RuntimeError("the server is already running")
            local_dir = self.scratch / "spark-local"
            local_dir.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    server_command(self.port, self.settings, local_dir),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=server_environment(),
                    start_new_session=True,  # its own process group, so stop() can reach every descendant
                )
            try:
                self._wait_until_ready()
            except BaseException:
                self.stop()
                raise

    def _wait_until_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not port_answers(self.port):
            if self._proc.poll() is not None:
                raise ConnectServerStartError(
                    f"the Spark Connect server exited with code {self._proc.returncode} before its port "
                    f"{self.port} answered; log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise ConnectServerStartError(
                    f"port {self.port} did not answer within {self.settings.start_timeout_s:.0f} s; "
                    f"log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.2)
        if self.settings.warm_up:
            budget = max(deadline - time.monotonic(), 30.0)
            try:
                self.warm_up_result = run_probe(self.remote, timeout_s=budget)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                raise ConnectServerStartError(
                    f"warm-up run against {self.remote} failed: {exc}\nserver log {self.log_path}:\n"
                    f"{_log_tail(self.log_path)}"
                ) from None

    def stop(self) -> None:
        with self._lock:
            if self._proc is None:
                return
            proc, self._proc = self._proc, None
            stop_process_tree(proc.pid, self.settings.stop_timeout_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)

    def restart(self) -> None:
        with self._lock:
            self.stop()
            self.start()
            self.restarts += 1

    def check_memory(self) -> bool:
        """Restart if the guard's rule says so; returns whether it did."""
        with self._lock:
            if self._proc is None:
                return False
            if needs_restart(self.rss_mb(), self.settings.rss_limit_mb, self.active_connections()):
                self.restart()
                return True
            return False

    def start_guard(self) -> None:
        """Check memory every ``check_interval_s`` in a background thread until ``stop_guard``."""
        if self.settings.rss_limit_mb is None or self._guard is not None:
            return
        self._guard_stop.clear()
        self._guard = threading.Thread(target=self._guard_loop, name="spark-connect-memory-guard", daemon=True)
        self._guard.start()

    def stop_guard(self) -> None:
        self._guard_stop.set()
        if self._guard is not None:
            self._guard.join(timeout=self.settings.stop_timeout_s + self.settings.start_timeout_s)
            self._guard = None

    def _guard_loop(self) -> None:
        while not self._guard_stop.wait(self.settings.check_interval_s):
            try:
                self.check_memory()
            except (ConnectServerStartError, procfs.ProcfsUnavailableError, RuntimeError) as exc:
                print(f"spark connect memory guard: {exc}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def running_connect_server(
    port: int | None = None, settings: ConnectServerSettings | None = None
) -> Iterator[ConnectServer]:
    """A warmed-up local Spark Connect server on 127.0.0.1 (a free port unless one is given), with its memory
    guard running; stopped by PID, with its whole process tree, on exit.

    A free port found by binding port 0 can be taken before the server binds it, so a server that exits
    before answering is retried on another port (only when the port was ours to choose)."""
    settings = settings or ConnectServerSettings()
    scratch = Path(tempfile.mkdtemp(prefix="streamgroup-spark-connect-"))
    attempts = 1 if port is not None else 3
    try:
        for attempt in range(attempts):
            server = ConnectServer(port if port is not None else free_port(), settings, scratch)
            try:
                server.start()
            except ConnectServerStartError as exc:
                if attempt + 1 < attempts and "exited with code" in str(exc):
                    continue
                raise
            break
        server.start_guard()
        try:
            yield server
        finally:
            server.stop_guard()
            server.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def serve(port: int = DEFAULT_PORT, settings: ConnectServerSettings | None = None) -> None:
    """Run the local server in the foreground until Ctrl-C or SIGTERM (``streamgroup local spark-connect``)."""
    settings = settings or ConnectServerSettings()
    scratch = Path(tempfile.mkdtemp(prefix="streamgroup-spark-connect-"))
    server = ConnectServer(port, settings, scratch)
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    try:
        print(f"starting Spark Connect ({settings.master}) on {server.remote}; log {server.log_path}", flush=True)
        server.start()
        limit = f"{settings.rss_limit_mb} MiB" if settings.rss_limit_mb else "none"
        print(
            f"Spark Connect server on {server.remote}, pid {server.pid}, rss {server.rss_mb():.0f} MiB "
            f"(restart limit {limit}); set SPARK_REMOTE={server.remote}; Ctrl-C stops it",
            flush=True,
        )
        while not stopping.wait(settings.check_interval_s):
            if server.check_memory():
                print(f"restarted the server (rss over {limit}); now pid {server.pid}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
