"""The local Apache Kafka broker: a single-node KRaft broker and controller, run from the jars the project's
set-up fetched (``scripts/setup.sh`` resolves ``kafka/pom.xml`` from Maven Central into ``.tools/``).

It is the embedded default for trying the project and the tests' real peer: the tests, the benchmarks, the chaos
run and the example all talk to it. It listens on 127.0.0.1 only, keeps its log in a data directory of its
own, runs with a bounded heap, and is stopped by PID. A SASL_SSL listener with SCRAM-SHA-512 and a throw-away
CA is added when users are asked for; their passwords reach the broker in an admin request, never on a command
line or in the JVM's environment. ``STREAMGROUP_KAFKA_BOOTSTRAP`` points the tests at a cluster of one's own
instead. Everything broker-specific lives here.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # listed, not re-exported, by the package
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.kafka_tls import make_broker_tls

KAFKA_VERSION = "4.4.0"
"""The Apache Kafka release ``kafka/pom.xml`` pins; its jars live in ``.tools/kafka-<version>/libs``."""

BOOTSTRAP_ENV = "STREAMGROUP_KAFKA_BOOTSTRAP"
"""Names a real cluster (``host:port[,host:port]``) that tests use instead of starting the local broker."""

LIBS_ENV = "STREAMGROUP_KAFKA_LIBS"
"""A folder of Apache Kafka's jars to run instead of the project's fetched copy."""

PROJECT_ROOT = Path(__file__).resolve().parents[2]

SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 4096
"""Kafka's minimum for SCRAM-SHA-512 (and its default)."""

SASL_PASSWORD_ENV = "STREAMGROUP_KAFKA_SASL_PASSWORD"
"""Where ``streamgroup local kafka --sasl-user`` reads the user's password. The broker's JVMs never get it."""

_USERS_CREATED = "scram-users-created"
"""A file in the data directory: the SCRAM users were created (a restart keeps them, and a rotated password)."""

FAST_HOUSEKEEPING: dict[str, str] = {
    # Retention, compaction and offset expiry are checked every second instead of every five minutes, and the
    # first check runs a second after start instead of thirty: tests see them happen in seconds.
    "log.initial.task.delay.ms": "500",
    "log.retention.check.interval.ms": "1000",
    "log.segment.delete.delay.ms": "500",
    "log.cleaner.backoff.ms": "500",
    "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    "offsets.retention.check.interval.ms": "1000",
}
"""Broker settings of the test brokers (``fast_housekeeping``)."""


@dataclass(frozen=True)
class BrokerInfo:
    bootstrap: str
    """``host:port`` of the PLAINTEXT listener, to put into ``bootstrap.servers``."""
    pid: int | None
    """The broker process we started, or ``None`` for an external cluster we must not stop."""
    sasl_bootstrap: str | None = None
    """``host:port`` of the SASL_SSL (SCRAM-SHA-512) listener, when the broker has one."""
    ca_file: Path | None = None
    """The CA that signed the SASL_SSL listener's certificate (``ssl.ca.location``)."""
    startup_s: float | None = None
    """Seconds from starting the JVM to the first answered metadata request."""
    data_dir: Path | None = None


class BrokerStartError(RuntimeError):
    """The local broker did not come up; the message carries the tail of its log."""


class KafkaNotInstalledError(BrokerStartError):
    """Apache Kafka's jars (or Java) are not on this machine."""


def external_bootstrap() -> str | None:
    """The bootstrap servers of a real cluster named by ``STREAMGROUP_KAFKA_BOOTSTRAP``, if set."""
    value = os.environ.get(BOOTSTRAP_ENV, "").strip()
    return value or None


def kafka_libs() -> Path:
    """The folder of Apache Kafka's jars: ``STREAMGROUP_KAFKA_LIBS``, else the project's fetched copy."""
    override = os.environ.get(LIBS_ENV, "").strip()
    candidates = [Path(override)] if override else []
    candidates += [root / ".tools" / f"kafka-{KAFKA_VERSION}" / "libs" for root in (PROJECT_ROOT, Path.cwd())]
    for folder in candidates:
        if (folder / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file() or (override and folder.is_dir()):
            return folder
    raise KafkaNotInstalledError(
        f"Apache Kafka {KAFKA_VERSION}'s jars are not installed (looked in {', '.join(map(str, candidates))}); "
        f"run `bash scripts/setup.sh` in the project (it fetches them from Maven Central), or set {LIBS_ENV} "
        "to a folder of Kafka's jars"
    )


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaNotInstalledError("the local broker needs Java 17 or newer: no `java` on the PATH, no JAVA_HOME")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (what ``random-uuid`` prints). Like
    Kafka's own ``Uuid.randomUuid``, never one that starts with ``-``: the storage tool's argument parser would
    take it for an option (one id in 64 did, and the broker failed to format)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


LOG4J_CONFIG = """\
rootLogger.level=WARN
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.server.name=kafka.server.KafkaRaftServer
logger.server.level=INFO
logger.cleaner.name=kafka.log.LogCleaner
logger.cleaner.level=INFO
logger.selector.name=org.apache.kafka.common.network.Selector
logger.selector.level=INFO
"""


@dataclass
class LocalKafka:
    """One broker process on fixed ports and one data directory: formatted once, started, and started again
    (after a stop, a SIGKILL or a SIGSTOP) with everything it had acknowledged."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    controller_port: int = 0
    sasl_port: int | None = None
    sasl_users: Mapping[str, str] = field(default_factory=dict, repr=False)
    """SCRAM-SHA-512 users (name -> password) of the SASL_SSL listener; none: no such listener."""
    heap_mb: int = 512
    fast_housekeeping: bool = True
    properties: Mapping[str, str] = field(default_factory=dict)
    """Broker properties that override ours (``offsets.retention.minutes``, ...)."""
    node_id: int = 1
    voters: str | None = None
    """A cluster's static controller quorum (``1@host:port,2@host:port,...``, ``local_cluster``); none: this
    node alone (``--standalone``)."""
    cluster_id: str = field(default_factory=new_cluster_id)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    startup_s: float | None = None
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        self.controller_port = self.controller_port or free_port(self.host)
        if self.sasl_users and self.sasl_port is None:
            self.sasl_port = free_port(self.host)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        return None if self.sasl_port is None else f"{self.host}:{self.sasl_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def info(self) -> BrokerInfo:
        return BrokerInfo(
            bootstrap=self.bootstrap, pid=self.pid, sasl_bootstrap=self.sasl_bootstrap, ca_file=self.ca_file,
            startup_s=self.startup_s, data_dir=self.data_dir,
        )  # fmt: skip

    def server_properties(self) -> dict[str, str]:
        replicas = 1 if self.voters is None else len(self.voters.split(","))
        min_isr = max(1, replicas - 1)
        listeners = {"PLAINTEXT": self.port, "CONTROLLER": self.controller_port}
        if self.sasl_port is not None:
            listeners["SASL_SSL"] = self.sasl_port
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": ",".join(f"{name}://{self.host}:{port}" for name, port in listeners.items()),
            "advertised.listeners": ",".join(
                f"{name}://{self.host}:{port}" for name, port in listeners.items() if name != "CONTROLLER"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(
                f"{name}:{'SASL_SSL' if name == 'SASL_SSL' else 'PLAINTEXT'}" for name in listeners
            ),
            "log.dirs": str(self.data_dir / "log"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min_isr),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(min_isr),
            "group.initial.rebalance.delay.ms": "0",
        }
        if self.voters is None:
            props["controller.quorum.bootstrap.servers"] = f"{self.host}:{self.controller_port}"
        else:
            props |= {"controller.quorum.voters": self.voters, "default.replication.factor": str(replicas)}
            props["min.insync.replicas"] = str(min_isr)
        if self.sasl_port is not None:
            assert self.ca_file is not None
            prefix = "listener.name.sasl_ssl."
            props |= {
                "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                f"{prefix}{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                f"{prefix}ssl.keystore.type": "PEM",
                f"{prefix}ssl.keystore.location": str(self.data_dir / "tls" / "broker-keystore.pem"),
            }
        if self.fast_housekeeping:
            props |= FAST_HOUSEKEEPING
        props |= dict(self.properties)
        return props

    def _write_config(self) -> Path:
        if self.sasl_port is not None and self.ca_file is None:
            self.ca_file = make_broker_tls(self.data_dir / "tls", self.host).ca_file
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in self.server_properties().items()))
        (self.data_dir / "log4j2.properties").write_text(LOG4J_CONFIG)
        return config

    def _java(self, main: str, *args: str, heap_mb: int) -> list[str]:
        return [
            java_binary(), f"-Xmx{heap_mb}m", "-Xss1m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", f"{kafka_libs()}/*", main, *args,
        ]  # fmt: skip

    def java_env(self) -> dict[str, str]:
        """The environment of the broker's JVMs: ours without the SASL password's variable, nor any variable
        that holds one of the users' passwords (the JVMs need none: the users are created by an admin request)."""
        passwords = {p for p in self.sasl_users.values() if p}
        return {k: v for k, v in os.environ.items() if k != SASL_PASSWORD_ENV and v not in passwords}

    def format(self) -> None:
        """Format the data directory once (KRaft ``--standalone``). The SCRAM users are not bootstrap records of
        the format (``--add-scram`` takes the password on the command line, where ``ps`` shows it): ``start``
        creates them."""
        if (self.data_dir / "log" / "meta.properties").is_file():
            return
        config = self._write_config()
        args = ["format", "--config", str(config), "--cluster-id", self.cluster_id]
        if self.voters is None:
            args.append("--standalone")
        done = subprocess.run(
            self._java("kafka.tools.StorageTool", *args, heap_mb=256),
            capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False, env=self.java_env(),
        )  # fmt: skip
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BrokerStartError(f"formatting the broker's data directory failed: {reason[0]}")

    def create_scram_users(self, timeout_s: float = 30.0) -> None:
        """Create the SCRAM users once, through the admin API on the PLAINTEXT listener (Kafka's
        ``AlterUserScramCredentials``, as an administrator rotates a password): the passwords travel in a
        request and the broker keeps only salted verifiers. Returns once each user logs in over SASL_SSL."""
        marker = self.data_dir / _USERS_CREATED
        if not self.sasl_users or marker.exists():
            return
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(name, info, p.encode()) for name, p in self.sasl_users.items()
        ]
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:  # the broker applies the controller's record to its credential cache a moment later
            described = admin.describe_user_scram_credentials(list(self.sasl_users))
            assert isinstance(described, dict)  # one future per user named
            try:
                if all(future.result(timeout_s).scram_credential_infos for future in described.values()):
                    break
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(f"the SCRAM users were not readable within {timeout_s:.0f} s")
            time.sleep(0.05)
        for name, password in self.sasl_users.items():
            self._check_login(name, password, timeout_s)
        marker.write_text("".join(f"{name}\n" for name in self.sasl_users))

    def _check_login(self, name: str, password: str, timeout_s: float) -> None:
        assert self.sasl_bootstrap is not None and self.ca_file is not None
        client = AdminClient(
            {
                "bootstrap.servers": self.sasl_bootstrap, "security.protocol": "SASL_SSL",
                "sasl.mechanisms": SCRAM_MECHANISM, "sasl.username": name, "sasl.password": password,
                "ssl.ca.location": str(self.ca_file),
            }
        )  # fmt: skip
        try:
            client.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerStartError(f"user {name!r} cannot log in over SASL_SSL: {exc.args[0].str()}") from None

    def start(self, timeout_s: float = 60.0, *, die_with_parent: bool = False) -> None:
        """Start the broker (formatting its data directory the first time) and wait until it answers.

        ``die_with_parent``: the kernel kills the broker when the thread that started it ends, so a test
        process that crashes (a segfault, SIGKILL) leaves no broker behind; only for a broker whose starter
        outlives it in the same thread (``running_broker``)."""
        self.format()
        config = self._write_config()
        started = time.monotonic()
        command = self._java("kafka.Kafka", str(config), heap_mb=self.heap_mb)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*(_DIE_WITH_PARENT if die_with_parent else []), *command],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env=self.java_env(),
            )  # fmt: skip
        try:
            wait_until_answering(self.bootstrap, timeout_s, self.proc)
            self.create_scram_users(timeout_s)
        except BrokerStartError as exc:
            self.kill()
            raise BrokerStartError(f"{exc}\nbroker log ({self.log_path}):\n{_log_tail(self.log_path)}") from None
        self.startup_s = time.monotonic() - started

    def stop(self, timeout_s: float = 20.0) -> None:
        """A clean shutdown (SIGTERM, the broker closes its logs), then SIGKILL if it lingers."""
        if self.proc is not None:
            self.resume()
            stop(self.proc.pid, timeout_s)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL: the broker dies as in a crash; ``start`` recovers its logs."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the broker answers nothing until ``resume`` (a broker stalled as under a long GC)."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            procfs.wait_until_stopped(self.proc.pid)

    def resume(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)


_SETPRIV = shutil.which("setpriv")
_DIE_WITH_PARENT = [_SETPRIV, "--pdeathsig", "SIGKILL", "--"] if _SETPRIV else []
"""util-linux's ``setpriv`` sets ``PR_SET_PDEATHSIG`` and execs the broker in its place (where it is missing,
a crashed starter leaves its broker running)."""


def wait_until_answering(bootstrap: str, timeout_s: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until a metadata request succeeds, so callers never race the broker's start.

    The port is probed first: a Kafka client created before the broker listens logs a "Connection refused"
    line for every reconnect, which reads like a failure on every start."""
    deadline = time.monotonic() + timeout_s
    while not _accepts_connections(bootstrap):
        if proc is not None and proc.poll() is not None:
            raise BrokerStartError(f"the broker exited with code {proc.returncode} before answering")
        if time.monotonic() > deadline:
            raise BrokerStartError(f"no answer from {bootstrap} within {timeout_s:.0f} s: nothing listens on the port")
        time.sleep(0.05)
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000})
    # Only the text of an error is kept: the exception's traceback would hold this frame, and with it the client,
    # which then outlives the call and logs a refused connection every second once the broker stops.
    last_error = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerStartError(f"the broker exited with code {proc.returncode} before answering")
        try:
            metadata = admin.list_topics(timeout=1.0)
            if metadata.brokers:
                return
        except KafkaException as exc:
            last_error = str(exc)
        time.sleep(0.05)
    raise BrokerStartError(f"no answer from {bootstrap} within {timeout_s:.0f} s: {last_error}")


def _accepts_connections(bootstrap: str) -> bool:
    """Whether any bootstrap address accepts a TCP connection (no Kafka request is sent)."""
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        with (
            contextlib.suppress(OSError, ValueError),
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.5),
        ):
            return True
    return False


def stop(pid: int, timeout_s: float = 20.0) -> None:
    """Stop a broker we started, by its PID: SIGTERM, then SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                # not our child: wait for it to be gone
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                done = 0
            if done:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def running_broker(
    port: int | None = None,
    *,
    sasl_users: Mapping[str, str] | None = None,
    properties: Mapping[str, str] | None = None,
    fast_housekeeping: bool = True,
    heap_mb: int = 512,
    start_timeout_s: float = 60.0,
) -> Iterator[BrokerInfo]:
    """A local broker on 127.0.0.1 (free ports unless one is given) with a temporary data directory, stopped
    by PID on exit.

    A free port found by binding port 0 can be taken by someone else before the broker binds it, so a
    broker that exits at once is retried on other ports (only when the ports were ours to choose)."""
    attempts = 1 if port is not None else 3
    with tempfile.TemporaryDirectory(prefix="streamgroup-kafka-") as tmp:
        for attempt in range(attempts):
            broker = LocalKafka(
                Path(tmp) / f"broker-{attempt}", port=port or 0, sasl_users=dict(sasl_users or {}),
                properties=dict(properties or {}), fast_housekeeping=fast_housekeeping, heap_mb=heap_mb,
            )  # fmt: skip
            try:
                broker.start(start_timeout_s, die_with_parent=True)
            except KafkaNotInstalledError:
                raise
            except BrokerStartError:
                if attempt + 1 < attempts:
                    continue
                raise
            try:
                yield broker.info()
            finally:
                broker.stop()
            return


@contextlib.contextmanager
def local_cluster(nodes: int = 3, *, start_timeout_s: float = 120.0, heap_mb: int = 384) -> Iterator[list[LocalKafka]]:
    """A KRaft cluster of ``nodes`` combined broker-controllers on 127.0.0.1 (a static quorum, one cluster id),
    for failover tests: topics default to ``nodes`` replicas with ``min.insync.replicas`` one less."""
    with tempfile.TemporaryDirectory(prefix="streamgroup-kafka-cluster-") as tmp:
        cluster_id = new_cluster_id()
        controller_ports = [free_port() for _ in range(nodes)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(controller_ports))
        brokers = [
            LocalKafka(
                Path(tmp) / f"node-{i + 1}",
                node_id=i + 1,
                controller_port=port,
                voters=voters,
                cluster_id=cluster_id,
                heap_mb=heap_mb,
            )
            for i, port in enumerate(controller_ports)
        ]
        try:
            for broker in brokers:
                broker.format()
            for broker in brokers:  # the quorum elects a leader once a majority runs: start without waiting
                command = broker._java("kafka.Kafka", str(broker._write_config()), heap_mb=broker.heap_mb)
                with broker.log_path.open("ab") as log:
                    broker.proc = subprocess.Popen(
                        [*_DIE_WITH_PARENT, *command],
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                        env=broker.java_env(),
                    )  # fmt: skip
            for broker in brokers:
                wait_until_answering(broker.bootstrap, start_timeout_s, broker.proc)
            yield brokers
        finally:
            for broker in brokers:  # a clean stop of the last node would wait for a quorum that is gone
                broker.kill()


def serve(host: str, port: int, *, data_dir: Path | None = None, sasl_users: Mapping[str, str] | None = None) -> None:
    """Run the local broker in the foreground until Ctrl-C or SIGTERM (``streamgroup local kafka``)."""
    if host not in {"127.0.0.1", "localhost", "::1"}:
        print(
            f"warning: the local broker's PLAINTEXT listener has no authentication; listening on {host}",
            file=sys.stderr,
        )

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # explicit handlers: a shell starts background jobs with SIGINT ignored, and SIGTERM must stop the broker too
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    with contextlib.ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamgroup-kafka-")))
        broker = LocalKafka(root, host=host, port=port, sasl_users=dict(sasl_users or {}), fast_housekeeping=False)
        try:
            broker.start()
            sasl = f", SASL_SSL (SCRAM-SHA-512) on {broker.sasl_bootstrap}, CA {broker.ca_file}" if sasl_users else ""
            print(
                f"Apache Kafka {KAFKA_VERSION} (KRaft, one node) on {broker.bootstrap}{sasl}, data in {root}, "
                f"pid {broker.pid}; started in {broker.startup_s:.1f} s; Ctrl-C stops it",
                flush=True,
            )
            assert broker.proc is not None
            broker.proc.wait()
        except KeyboardInterrupt:
            pass
        finally:
            broker.stop()
