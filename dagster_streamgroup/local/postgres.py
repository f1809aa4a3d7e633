"""A throw-away PostgreSQL server for tests and benchmarks: initdb in a temporary directory, 127.0.0.1 on a
free port, stopped by PID and deleted on exit.

PostgreSQL refuses to run as root, so when we are root the server runs as the ``postgres`` system user
(Debian's package creates it) and the temporary directory is handed to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dagster_streamgroup.extras import missing_extra

try:
    import psycopg
except ImportError as exc:
    raise missing_extra("psycopg", "postgres", "the temporary PostgreSQL server") from exc
from sqlalchemy.engine import URL

SEARCH_GLOB = "/usr/lib/postgresql/*/bin"
_START_ATTEMPTS = 3


class PostgresNotFoundError(RuntimeError):
    """No PostgreSQL server binaries (initdb, postgres) on this machine."""


class PostgresStartError(RuntimeError):
    """The server binaries exist but the temporary server could not be started."""


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str


def find_server_binaries() -> Path:
    """The directory holding ``initdb`` and ``postgres``: Debian's newest /usr/lib/postgresql/N/bin, else PATH."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    candidates = sorted(Path("/").glob(SEARCH_GLOB.lstrip("/")), key=version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "postgres").is_file():
            return directory
    raise PostgresNotFoundError(f"no initdb and postgres in {SEARCH_GLOB} or on PATH")


def _run_as() -> _RunAs | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresStartError(
            "running as root, and PostgreSQL refuses to run as root; the 'postgres' system user it would run "
            "as does not exist (install Debian's postgresql package, or run as a non-root user)"
        ) from None
    return _RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _subprocess_user(run_as: _RunAs | None) -> dict[str, object]:
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


_SERVER_VARIABLES = ("PATH", "LD_LIBRARY_PATH", "TZ", "TMPDIR")
"""What ``initdb`` and ``postgres`` may need of our environment: where programs and libraries are, the time zone
initdb writes into the configuration, where temporary files go."""


def server_env() -> dict[str, str]:
    """The environment of ``initdb`` and ``postgres``: only what they need, in the C locale. They run as another
    OS user (``postgres``, when we are root) and need none of the passwords ours may hold (the Dagster instance's
    ``DAGSTER_PG_PASSWORD``, a store URL, a SASL password); the superuser's password reaches initdb in a file."""
    return {**{k: os.environ[k] for k in _SERVER_VARIABLES if k in os.environ}, "LC_ALL": "C", "LANG": "C"}


def _log_tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


@contextlib.contextmanager
def temporary_postgres(*, durable: bool = True, startup_timeout_s: float = 60.0) -> Iterator[str]:
    """Yield a SQLAlchemy URL (``postgresql+psycopg://``) of a fresh server with an empty database.

    ``durable=False`` turns off fsync and synchronous commit: faster tests, figures that mean nothing.
    Raises ``PostgresNotFoundError`` when the binaries are missing."""
    bindir = find_server_binaries()
    run_as = _run_as()
    root = Path(tempfile.mkdtemp(prefix="streamgroup-pg-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        user_kw = _subprocess_user(run_as)
        data, sockets, log = root / "data", root / "sock", root / "server.log"
        password = secrets.token_urlsafe(18)
        (root / "pwfile").write_text(password + "\n")
        sockets.mkdir()
        if run_as is not None:
            for path in (root, sockets, root / "pwfile"):
                os.chown(path, run_as.uid, run_as.gid)
        env = server_env()
        init = subprocess.run(
            [
                str(bindir / "initdb"),
                "-D", str(data),
                "-U", "streamgroup",
                "--auth=scram-sha-256",
                f"--pwfile={root / 'pwfile'}",
                "--encoding=UTF8",
                "--no-sync",
            ],
            cwd=root, env=env, capture_output=True, text=True, check=False, timeout=180,
            **user_kw,  # type: ignore[call-overload]
        )  # fmt: skip
        if init.returncode != 0:
            raise PostgresStartError(f"initdb failed ({init.returncode}): {init.stderr.strip()[-2000:]}")
        settings = ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sockets}"]
        settings += ["-c", "max_connections=100", "-c", "shared_buffers=32MB"]
        if not durable:
            settings += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        for _attempt in range(_START_ATTEMPTS):
            port = _free_port()
            with log.open("ab") as log_file:
                proc = subprocess.Popen(
                    [str(bindir / "postgres"), "-D", str(data), "-p", str(port), *settings],
                    cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                    **user_kw,  # type: ignore[call-overload]
                )  # fmt: skip
            url = URL.create(
                "postgresql+psycopg", username="streamgroup", password=password, host="127.0.0.1", port=port,
                database="postgres",
            )  # fmt: skip
            if _wait_ready(proc, url, startup_timeout_s):
                break
            _stop(proc)
            proc = None
        else:
            raise PostgresStartError(f"the server did not start; log {log}:\n{_log_tail(log)}")
        with psycopg.connect(_dsn(url), autocommit=True) as conn:
            conn.execute("CREATE DATABASE streamgroup")
        yield url.set(database="streamgroup").render_as_string(hide_password=False)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def _dsn(url: URL) -> str:
    return psycopg.conninfo.make_conninfo(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database,
        connect_timeout=5,
    )  # fmt: skip


def _wait_ready(proc: subprocess.Popen[bytes], url: URL, timeout_s: float) -> bool:
    """True once the server accepts a connection; False if it exited (a lost port race) or timed out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with psycopg.connect(_dsn(url)):
                return True
        except psycopg.OperationalError:
            time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Fast shutdown (SIGINT: abort sessions, checkpoint, exit); SIGKILL if it hangs."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
