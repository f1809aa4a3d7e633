"""The local Schema Registry: Apicurio Registry's runnable application, which serves Confluent's Schema Registry API
at ``/apis/ccompat/v7``, run from what the project's set-up fetched (``scripts/setup.sh`` copies
``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` from Maven Central, checks it against
``registry/archive.sha256``, unpacks it into ``.tools/apicurio-registry-<version>`` and checks every file against
``registry/files.sha256``).

It is the tests', the benchmarks' and the example's registry: in-memory storage (H2), Confluent's default
compatibility (BACKWARD), on 127.0.0.1 only, its management port (health) moved off 9000 to a free one, a bounded
heap, stopped by PID. It needs Java 21 or newer (its classes are version 65): ``STREAMGROUP_REGISTRY_JAVA`` names a
``java`` binary, else the first Java 21+ found among ``$JAVA_HOME``, ``java`` on the PATH and the JDKs under
``/usr/lib/jvm``. ``STREAMGROUP_SCHEMA_REGISTRY_URL`` points the tests at a registry of one's own instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dagster_streamgroup.local.kafka_broker import _DIE_WITH_PARENT, free_port, stop

REGISTRY_VERSION = "3.3.3"
"""The Apicurio Registry release ``registry/pom.xml`` pins."""

REGISTRY_HOME_ENV = "STREAMGROUP_REGISTRY_HOME"
"""A folder holding Apicurio Registry's unpacked application (``quarkus-run.jar``) to run instead of the fetched one."""

REGISTRY_JAVA_ENV = "STREAMGROUP_REGISTRY_JAVA"
"""A Java 21+ ``java`` binary to run the registry with."""

REGISTRY_URL_ENV = "STREAMGROUP_SCHEMA_REGISTRY_URL"
"""A registry of one's own (its Confluent-compatible base URL) that the tests use instead of starting one."""

CCOMPAT_PATH = "/apis/ccompat/v7"
MIN_JAVA = 21
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class RegistryStartError(RuntimeError):
    """The local registry did not come up; the message carries the tail of its log."""


class RegistryNotInstalledError(RegistryStartError):
    """Apicurio Registry's application, or a Java 21+, is not on this machine."""


@dataclass(frozen=True)
class RegistryInfo:
    url: str
    """The Confluent-compatible base URL (``http://127.0.0.1:PORT/apis/ccompat/v7``)."""
    pid: int | None
    """The registry process we started, or ``None`` for one of the user's own."""
    startup_s: float | None = None


def external_registry() -> str | None:
    value = os.environ.get(REGISTRY_URL_ENV, "").strip()
    return value or None


def registry_home() -> Path:
    """The unpacked application: ``STREAMGROUP_REGISTRY_HOME``, else the project's fetched copy."""
    override = os.environ.get(REGISTRY_HOME_ENV, "").strip()
    candidates = [Path(override)] if override else []
    candidates += [root / ".tools" / f"apicurio-registry-{REGISTRY_VERSION}" for root in (PROJECT_ROOT, Path.cwd())]
    for folder in candidates:
        if (folder / "quarkus-run.jar").is_file():
            return folder
    raise RegistryNotInstalledError(
        f"Apicurio Registry {REGISTRY_VERSION} is not installed (looked in {', '.join(map(str, candidates))}); run "
        f"`bash scripts/setup.sh` in the project (it fetches it from Maven Central), or set {REGISTRY_HOME_ENV} to a "
        "folder holding its quarkus-run.jar"
    )


def java_major(java: str) -> int | None:
    """The major version of a ``java`` binary (``None`` when it does not run)."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _release_major(home: Path) -> int | None:
    """A JDK's major version from its ``release`` file (no JVM started)."""
    with contextlib.suppress(OSError):
        found = re.search(r'JAVA_VERSION="(\d+)', (home / "release").read_text())
        if found is not None:
            return int(found.group(1))
    return None


def registry_java() -> str:
    """A ``java`` of version 21 or newer, or ``RegistryNotInstalledError`` naming where it looked."""
    override = os.environ.get(REGISTRY_JAVA_ENV, "").strip()
    if override:
        major = java_major(override)
        if major is None or major < MIN_JAVA:
            raise RegistryNotInstalledError(
                f"{REGISTRY_JAVA_ENV}={override} is not a Java {MIN_JAVA}+ (found {major or 'nothing that runs'})"
            )
        return override
    looked: list[str] = []
    homes = [Path(os.environ["JAVA_HOME"])] if os.environ.get("JAVA_HOME") else []
    on_path = shutil.which("java")
    if on_path:
        homes.append(Path(on_path).resolve().parent.parent)
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        homes += sorted((p for p in jvm.iterdir() if p.is_dir() and not p.is_symlink()), reverse=True)
    for home in homes:
        binary = home / "bin" / "java"
        looked.append(str(home))
        if not binary.is_file():
            continue
        major = _release_major(home) or java_major(str(binary))
        if major is not None and major >= MIN_JAVA:
            return str(binary)
    raise RegistryNotInstalledError(
        f"the local Schema Registry (Apicurio Registry {REGISTRY_VERSION}) needs Java {MIN_JAVA} or newer; none "
        f"found (looked in {', '.join(looked) or 'JAVA_HOME, the PATH and /usr/lib/jvm'}). Install one (a Temurin "
        f"or OpenJDK {MIN_JAVA}+), or set {REGISTRY_JAVA_ENV} to its java binary"
    )


def answers(url: str, timeout_s: float = 1.0) -> bool:
    """Whether the registry's Confluent API answers (its subject list)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


@dataclass
class LocalRegistry:
    """One registry process on a fixed port; in-memory storage, so a restart starts empty."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    management_port: int = 0
    heap_mb: int = 256
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    startup_s: float | None = None

    def __post_init__(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        self.management_port = self.management_port or free_port(self.host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "registry.log"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def info(self) -> RegistryInfo:
        return RegistryInfo(url=self.url, pid=self.pid, startup_s=self.startup_s)

    def command(self) -> list[str]:
        home = registry_home()
        return [
            registry_java(), f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dquarkus.http.host={self.host}", f"-Dquarkus.http.port={self.port}",
            f"-Dquarkus.management.host={self.host}", f"-Dquarkus.management.port={self.management_port}",
            "-Dapicurio.storage.kind=sql", "-Dapicurio.storage.sql.kind=h2",
            "-Dapicurio.rules.global.compatibility=BACKWARD",
            "-Dquarkus.http.access-log.enabled=false", "-Dquarkus.log.level=WARN",
            f"-Djava.io.tmpdir={self.data_dir}",
            "-jar", str(home / "quarkus-run.jar"),
        ]  # fmt: skip

    def start(self, timeout_s: float = 90.0, *, die_with_parent: bool = False) -> None:
        """Start the registry and wait until its Confluent API answers."""
        command = self.command()
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*(_DIE_WITH_PARENT if die_with_parent else []), *command],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=self.data_dir,
            )  # fmt: skip
        deadline = started + timeout_s
        while not answers(self.url, timeout_s=1.0):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise RegistryStartError(
                    f"the registry exited with code {code} before answering\nregistry log ({self.log_path}):\n"
                    f"{_log_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RegistryStartError(
                    f"no answer from {self.url} within {timeout_s:.0f} s\nregistry log ({self.log_path}):\n"
                    f"{_log_tail(self.log_path)}"
                )
            time.sleep(0.2)
        self.startup_s = time.monotonic() - started

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            stop(self.proc.pid, timeout_s)
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the registry answers nothing until ``resume`` (an outage that keeps its schemas)."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def running_registry(port: int | None = None, *, start_timeout_s: float = 90.0) -> Iterator[LocalRegistry]:
    """A local registry on 127.0.0.1 (a free port unless one is given), stopped by PID on exit; a start whose
    chosen port was taken meanwhile is retried on another."""
    attempts = 1 if port is not None else 3
    with tempfile.TemporaryDirectory(prefix="streamgroup-registry-") as tmp:
        for attempt in range(attempts):
            registry = LocalRegistry(Path(tmp) / f"registry-{attempt}", port=port or 0)
            try:
                registry.start(start_timeout_s, die_with_parent=True)
            except RegistryNotInstalledError:
                raise
            except RegistryStartError:
                if attempt + 1 < attempts:
                    continue
                raise
            try:
                yield registry
            finally:
                registry.stop()
            return


def serve(host: str, port: int) -> None:
    """Run the local registry in the foreground until Ctrl-C or SIGTERM (``streamgroup local registry``)."""
    if host not in {"127.0.0.1", "localhost", "::1"}:
        print(f"warning: the local registry has no authentication; listening on {host}", file=sys.stderr)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    with tempfile.TemporaryDirectory(prefix="streamgroup-registry-") as tmp:
        registry = LocalRegistry(Path(tmp), host=host, port=port)
        try:
            registry.start()
            print(
                f"Schema Registry (Apicurio Registry {REGISTRY_VERSION}, Confluent API) at {registry.url}, in-memory "
                f"storage, pid {registry.pid}; started in {registry.startup_s:.1f} s; Ctrl-C stops it",
                flush=True,
            )
            assert registry.proc is not None
            registry.proc.wait()
        except KeyboardInterrupt:
            pass
        finally:
            registry.stop()
