"""A Spark standalone cluster on 127.0.0.1, started from the jars inside the installed pyspark package.

A local session runs tasks in the driver's own JVM; a real deployment runs them in executor JVMs on other
hosts, each with its own Python workers, so what a run ships to them (the data sources, their options,
``PYSPARK_PYTHON``, this package) has to travel. This cluster shows that on one machine with real processes: a
master and N workers (``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each
worker starting an executor JVM per application. Everything listens on 127.0.0.1: the master's RPC and web UI
on free ports (its JSON status, ``/json/``, is how we wait for the workers), the workers on ports the OS picks,
the master's REST submission server off. Scratch and work dirs live in one temporary directory; every process
is stopped by PID, with its process group (the executors), when the context manager exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.spark_connect import free_port, spark_home, stop_process_tree
from dagster_streamgroup.spark.session import ARROW_JAVA_OPTIONS

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MIN_JAVA = 17
"""Spark 4 runs on Java 17 or 21."""
_MEMORY = r"^[0-9]+[kKmMgGtT]?$"
_CLIENT_ENV_TO_DROP = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "PYSPARK_SUBMIT_ARGS")

DAEMON_PROPERTIES: dict[str, str] = {
    # A fixed port (6066) that a second cluster or another user's Spark would collide with; nothing here uses it.
    "spark.master.rest.enabled": "false",
    # A taken port must fail the start (we retry on other ports), not move the master to port+1 unseen.
    "spark.port.maxRetries": "0",
}


class SparkClusterSettings(BaseModel):
    """How the local cluster runs. Validation errors name the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: int = Field(default=2, ge=1, le=32, description="Worker processes (each starts one executor per app).")
    cores_per_worker: int = Field(default=1, ge=1, le=256, description="Cores each worker offers executors.")
    worker_memory: str = Field(
        default="1g",
        pattern=_MEMORY,
        description="Memory each worker offers executors; an executor needs at least 450 MiB (Spark's minimum).",
    )
    daemon_memory: str = Field(default="256m", pattern=_MEMORY, description="JVM heap of the master and workers.")
    start_timeout_s: float = Field(default=120.0, gt=0, description="Budget for the master and every worker.")
    stop_timeout_s: float = Field(default=30.0, gt=0, description="Grace period before a process is killed.")
    conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark properties of the master and workers, passed through untouched."
    )

    @field_validator("conf")
    @classmethod
    def _one_line_each(cls, conf: dict[str, str]) -> dict[str, str]:
        for key, value in conf.items():
            if not key.strip() or any(c in key + value for c in "\r\n") or any(c in key for c in "=: "):
                raise ValueError(f"conf: {key!r} must be a property name without '=', ':' or blanks, one line each")
        return conf


class SparkClusterStartError(RuntimeError):
    """A process of the cluster did not come up; the message carries the tail of its log."""


class JavaNotFoundError(SparkClusterStartError):
    """No usable Java runtime (``JAVA_HOME`` or ``java`` on ``PATH``)."""


@dataclass(frozen=True)
class ClusterProcess:
    """One daemon we started: ``master`` or ``worker-<i>``."""

    role: str
    pid: int
    log_path: Path


@dataclass(frozen=True)
class ExecutorProcess:
    """An executor JVM a worker started for an application."""

    pid: int
    executor_id: str
    app_id: str
    worker_pid: int


# Pure helpers ---------------------------------------------------------------------------------------------------


def properties_text(properties: Mapping[str, str]) -> str:
    """A Java properties file (``--properties-file``); backslashes escaped, one property a line."""
    return "".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in properties.items())


def master_command(spark_class: Path, port: int, webui_port: int, properties_file: Path) -> list[str]:
    return [
        str(spark_class), MASTER_CLASS,
        "--host", HOST, "--port", str(port), "--webui-port", str(webui_port),
        "--properties-file", str(properties_file),
    ]  # fmt: skip


def worker_command(
    spark_class: Path, master_url: str, settings: SparkClusterSettings, work_dir: Path, properties_file: Path
) -> list[str]:
    """A worker on OS-chosen ports (``--port 0``, ``--webui-port 0``): nothing needs to know them in advance."""
    return [
        str(spark_class), WORKER_CLASS, master_url,
        "--host", HOST, "--port", "0", "--webui-port", "0",
        "--cores", str(settings.cores_per_worker), "--memory", settings.worker_memory,
        "--work-dir", str(work_dir), "--properties-file", str(properties_file),
    ]  # fmt: skip


def alive_workers(status: Mapping[str, Any]) -> list[str]:
    """Ids of the workers the master's ``/json/`` status lists as ALIVE."""
    return [str(w.get("id")) for w in status.get("workers", []) if w.get("state") == "ALIVE"]


def parse_java_version(text: str) -> int | None:
    """The major version in ``java -version`` output (``"17.0.15"`` -> 17, ``"1.8.0_392"`` -> 8)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def executor_of(cmdline: list[bytes]) -> tuple[str, str] | None:
    """``(executor id, app id)`` when the command line is an executor JVM's, else None."""
    args = [part.decode(errors="replace") for part in cmdline]
    if EXECUTOR_CLASS not in args:
        return None

    def value(flag: str) -> str:
        return args[args.index(flag) + 1] if flag in args[:-1] else ""

    return value("--executor-id"), value("--app-id")


def application_config(
    master_url: str, settings: SparkClusterSettings, executor_memory: str = "512m"
) -> dict[str, str]:
    """What a driver sets to run on this cluster: every worker's cores, a small executor each, and no job before
    all executors registered (standalone's default is to start as soon as one has, so a short job could run on
    one worker). ``spark.executor.extraJavaOptions`` carries Arrow Java's unchecked reads: on a cluster the
    executors, not the driver, turn our sources' Arrow batches into rows."""
    return {
        "spark.master": master_url,
        "spark.executor.cores": str(settings.cores_per_worker),
        "spark.cores.max": str(settings.cores_per_worker * settings.workers),
        "spark.executor.memory": executor_memory,
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        "spark.executor.extraJavaOptions": ARROW_JAVA_OPTIONS,
    }


# I/O ---------------------------------------------------------------------------------------------------------------


def find_java(env: Mapping[str, str]) -> str:
    """The ``java`` that ``spark-class`` will run (``$JAVA_HOME/bin/java``, else the first on ``PATH``), checked to be
    Java 17 or newer."""
    java_home = env.get("JAVA_HOME", "").strip()
    if java_home:
        java = str(Path(java_home) / "bin" / "java")
        if not os.access(java, os.X_OK):
            raise JavaNotFoundError(f"JAVA_HOME={java_home}: no executable bin/java there; fix or unset JAVA_HOME")
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if found is None:
            raise JavaNotFoundError(
                f"Java not found: install a Java {MIN_JAVA}+ runtime (e.g. apt-get install openjdk-17-jre-headless) "
                "or set JAVA_HOME; Spark's master and workers are JVMs"
            )
        java = found
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFoundError(f"{java} -version failed: {exc}") from None
    version = parse_java_version(done.stderr + done.stdout)
    if version is None or version < MIN_JAVA:
        said = (done.stderr or done.stdout).strip().splitlines()[:1]
        raise JavaNotFoundError(f"{java} is {said[0] if said else 'unknown'}; Spark 4 needs Java {MIN_JAVA} or newer")
    return java


def spark_class() -> Path:
    path = spark_home() / "bin" / "spark-class"
    if not os.access(path, os.X_OK):
        raise SparkClusterStartError(f"{path} is missing or not executable: reinstall pyspark")
    return path


def daemon_environment(scratch: Path, settings: SparkClusterSettings) -> dict[str, str]:
    """This environment for the daemons and, through the workers, the executors: Spark from the pyspark package,
    loopback only, the daemons' heap, executors' scratch space in our temporary directory, and no client-mode
    switches (they would make an executor's Python a Connect client)."""
    env = {key: value for key, value in os.environ.items() if key not in _CLIENT_ENV_TO_DROP}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP=HOST,
        SPARK_DAEMON_MEMORY=settings.daemon_memory,
        SPARK_LOCAL_DIRS=str(scratch / "local"),
        SPARK_CONF_DIR=str(scratch / "conf"),  # an empty conf dir: no spark-env.sh / defaults of the machine
    )
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def master_status(webui_port: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The master's ``/json/`` status, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{webui_port}/json/", timeout=timeout_s) as response:
            status: dict[str, Any] = json.loads(response.read())
            return status
    except (urllib.error.URLError, OSError, ValueError):
        return None


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class SparkCluster:
    """One running cluster. ``master_url`` (``spark://127.0.0.1:PORT``) is what drivers take as ``master``."""

    settings: SparkClusterSettings
    scratch: Path
    master_port: int = 0
    webui_port: int = 0
    master: ClusterProcess | None = None
    workers: list[ClusterProcess] = field(default_factory=list)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}"

    def status(self) -> dict[str, Any] | None:
        return master_status(self.webui_port)

    def application_config(self, executor_memory: str = "512m") -> dict[str, str]:
        return application_config(self.master_url, self.settings, executor_memory)

    def executor_processes(self) -> list[ExecutorProcess]:
        """The executor JVMs our workers run now (for every application), found in ``/proc``."""
        found = []
        for worker in self.workers:
            for pid in procfs.process_tree(worker.pid)[1:]:
                executor = executor_of(procfs.cmdline(pid))
                if executor is not None:
                    found.append(ExecutorProcess(pid, executor[0], executor[1], worker.pid))
        return found

    def start(self) -> None:
        """Start the master, then the workers, and block until the master lists every worker as ALIVE."""
        java = find_java(os.environ)
        launcher = spark_class()
        for sub in ("conf", "local", "logs"):
            (self.scratch / sub).mkdir(parents=True, exist_ok=True)
        properties_file = self.scratch / "conf" / "daemons.properties"
        properties_file.write_text(properties_text({**DAEMON_PROPERTIES, **self.settings.conf}))
        env = daemon_environment(self.scratch, self.settings)
        if "JAVA_HOME" not in env:
            env["JAVA_HOME"] = str(Path(os.path.realpath(java)).parent.parent)
        deadline = time.monotonic() + self.settings.start_timeout_s
        self.master_port, self.webui_port = free_port(), free_port()
        self.master = self._spawn(
            "master", master_command(launcher, self.master_port, self.webui_port, properties_file), env
        )
        self._wait(deadline, lambda status: status.get("status") == "ALIVE", "the master to be ALIVE")
        for i in range(1, self.settings.workers + 1):
            work_dir = self.scratch / f"worker-{i}"
            work_dir.mkdir(exist_ok=True)
            command = worker_command(launcher, self.master_url, self.settings, work_dir, properties_file)
            self.workers.append(self._spawn(f"worker-{i}", command, env))
        wanted = self.settings.workers
        self._wait(deadline, lambda status: len(alive_workers(status)) >= wanted, f"{wanted} workers to register")

    def _spawn(self, role: str, command: list[str], env: dict[str, str]) -> ClusterProcess:
        log_path = self.scratch / "logs" / f"{role}.log"
        with log_path.open("ab") as log, self._lock:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.scratch,
                start_new_session=True,  # its own process group: stop() reaches the executors a worker forks
            )
            self._procs.append(proc)
        return ClusterProcess(role, proc.pid, log_path)

    def _wait(self, deadline: float, ready: Callable[[Mapping[str, Any]], bool], what: str) -> None:
        roles = [p for p in (self.master, *self.workers) if p is not None]
        while True:
            for proc, process in zip(self._procs, roles, strict=True):
                if proc.poll() is not None:
                    raise SparkClusterStartError(
                        f"Spark {process.role} (pid {process.pid}) exited with code {proc.returncode} while waiting "
                        f"for {what}; the end of its log:\n{log_tail(process.log_path)}"
                    )
            status = self.status()
            if status is not None and ready(status):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.role}:\n{log_tail(p.log_path, 15)}" for p in roles)
                raise SparkClusterStartError(
                    f"timed out after {self.settings.start_timeout_s:.0f} s waiting for {what} "
                    f"(master status: {status}); the end of each log:\n{logs}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Workers first (each stops its executors), then the master; by PID, process groups included."""
        with self._lock:
            procs, self._procs = list(reversed(self._procs)), []
        for proc in procs:
            stop_process_tree(proc.pid, self.settings.stop_timeout_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)


@contextlib.contextmanager
def running_spark_cluster(settings: SparkClusterSettings | None = None) -> Iterator[SparkCluster]:
    """A master and ``settings.workers`` registered workers on 127.0.0.1, stopped by PID on exit (also when the
    body raises). A free port found by binding port 0 can be taken before the master binds it; the master then
    exits at start, and the cluster is started again on other ports (up to three times)."""
    settings = settings or SparkClusterSettings()
    scratch = Path(tempfile.mkdtemp(prefix="streamgroup-spark-cluster-"))
    try:
        for attempt in range(3):
            cluster = SparkCluster(settings, scratch / f"attempt-{attempt}")
            try:
                cluster.start()
            except SparkClusterStartError as exc:
                cluster.stop()
                if attempt < 2 and "master (pid" in str(exc) and "BindException" in str(exc):
                    continue
                raise
            except BaseException:
                cluster.stop()
                raise
            break
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def serve(settings: SparkClusterSettings | None = None) -> None:
    """Run the cluster in the foreground until Ctrl-C or SIGTERM (``streamgroup local spark-cluster``)."""
    settings = settings or SparkClusterSettings()
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    try:
        print(f"starting a Spark master and {settings.workers} worker(s) on {HOST}", flush=True)
        with running_spark_cluster(settings) as cluster:
            config = {k: v for k, v in cluster.application_config().items() if k != "spark.master"}
            conf = " ".join(f"--conf {shlex.quote(f'{k}={v}')}" for k, v in config.items())
            print(
                f"Spark standalone master {cluster.master_url} (web UI {cluster.webui_url}): {settings.workers} "
                f"worker(s) x {settings.cores_per_worker} core(s), {settings.worker_memory} each; "
                f"logs in {cluster.scratch / 'logs'}\n"
                f"  StreamSparkResource(master={cluster.master_url!r}, spark_config={config!r})\n"
                f"  streamgroup local spark-connect --master {cluster.master_url} {conf}\n"
                "Ctrl-C stops it",
                flush=True,
            )
            while not stopping.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
