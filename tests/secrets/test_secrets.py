"""Secrets never leak: the example deployed with a SASL password, a v3io access key and PostgreSQL passwords,
each a fresh random value full of punctuation given only as the docs say (a mounted file, ``dagster.EnvVar``),
the state store's URL in each form a user writes it (the password in the user info, ``?password=``,
``?sslpassword=``; a keyword DSN, a scheme a slash short, an unencoded ``@``: refused when the definitions load),
runs that succeed and runs that fail on rotated passwords, the CLI with good and bad configurations; then every
log line, run tag, event, metadata entry, sensor tick, code location error, error and stored byte of the
deployment (Dagster's ``runs``, ``snapshots``, ``event_logs`` and ``job_ticks`` tables decompressed), the CLI's
output, and the command line of every process on the machine sampled all along (``ps``) and the environment of
the broker's JVM, are searched for each value (as written, hex, base64, URL-quoted, JSON-escaped).
docs/reliability.md ("Secrets") has the result.

Real parts throughout: a real ``dagster dev`` (daemon, webserver, code servers) with the example's asset and
member sensors, the local Apache Kafka broker, the project's v3io server requiring its key, PostgreSQL, a Spark
Connect server (the example's default). The broker is ``streamgroup local kafka --sasl-user`` with a SASL_SSL
listener (SCRAM-SHA-512, a CA made for its start), started as docs/kafka.md has it (the password in
``STREAMGROUP_KAFKA_SASL_PASSWORD``); the password is rotated on it with Kafka's own ``AlterUserScramCredentials``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload
from urllib.parse import quote

import dagster as dg
import psycopg
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # listed, not re-exported, by the package
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from dagster._core.instance.ref import InstanceRef
from psycopg import sql
from pydantic import SecretStr
from sqlalchemy.engine import URL, make_url

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupResource, V3ioStreamGroup
from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev, wait_for
from dagster_streamgroup.dagster.literal_secrets import LiteralSecretError
from dagster_streamgroup.dagster.resources import release_cached_clients
from dagster_streamgroup.dagster.tags import TAG_GROUP
from dagster_streamgroup.local.dagster_storage import provision_database
from dagster_streamgroup.local.kafka_broker import SASL_PASSWORD_ENV, free_port, wait_until_answering
from dagster_streamgroup.local.kafka_data import create_topics
from dagster_streamgroup.local.spark_connect import ConnectServerSettings, running_connect_server
from dagster_streamgroup.local.v3io.testing import V3ioServerProcess
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from jobs.clickstream_events import ensure_v3io_stream, produce_burst, produce_v3io_burst, producers, v3io_client
from tests.e2e.scenario import committed_at_high, ended_runs
from tests.secrets import names as location
from tests.secrets.evidence import (
    database_evidence,
    event_log_evidence,
    graphql_evidence,
    group_state,
    instance_evidence,
    spark_ui_evidence,
    sqlite_evidence,
    state_evidence,
)
from tests.secrets.leaks import Evidence, describe, find_secrets, needles
from tests.secrets.proc import CommandLineSampler, add_environments, descendants

WORKSPACE = Path(__file__).with_name("workspace.yaml")
DEFINITIONS = Path(__file__).with_name("definitions.py")
V3IO_CONTAINER = "bigdata"
PARTITIONS = 2
RECORDS = 2_000
CLI = str(ROOT / ".venv/bin/streamgroup")


PUNCTUATION = "!#$%&()*+,-./:;<=>?@[]^_{|}~"
"""A password full of punctuation: every character that cuts a URL or a DSN, or that a log escapes (no quote,
backslash or space: a SASL password file and the Java client's JAAS line take them, but not all places do)."""


def new_secret() -> str:
    """24 characters: letters and digits with punctuation among them, an ``@`` and a ``/`` always (a URL that
    holds them unencoded is not read alike by its drivers)."""
    chars = [*secrets.token_urlsafe(12)[:14], "@", "/", *(secrets.choice(PUNCTUATION) for _ in range(8))]
    random.SystemRandom().shuffle(chars)
    return "".join(chars)


# The peers: the broker behind its SASL_SSL listener, a v3io server that requires its key, the state's database.


@dataclass
class SaslBroker:
    """``streamgroup local kafka --sasl-user``: the local Apache Kafka with a SASL_SSL listener (SCRAM-SHA-512, a
    CA made for this start); the deployment reaches it only there. Its PLAINTEXT listener stays the operator's
    door, used to rotate the password as an administrator would."""

    bootstrap: str
    address: str
    ca_file: Path
    log: Path
    """The broker's data directory, its log among its files."""
    proc: subprocess.Popen[bytes]
    """The CLI process (it holds the password it was given); the broker's JVM is its child."""

    def client_config(self, password: str) -> KafkaStreamConfig:
        return KafkaStreamConfig(
            bootstrap_servers=self.address,
            topics=["unused"],
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=location.SASL_USERNAME,
            sasl_password=SecretStr(password),
            ssl_ca_location=self.ca_file,
        )

    def rotate(self, password: str) -> None:
        """The user's SCRAM credential replaced: new logins with the old password are refused; connections
        already authenticated stay open, as Kafka keeps them until they re-authenticate."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        change = UserScramCredentialUpsertion(
            location.SASL_USERNAME, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        for future in admin.alter_user_scram_credentials([change]).values():
            future.result(30)

    @property
    def refused(self) -> int:
        """SASL logins the broker refused (its ``Failed authentication`` lines)."""
        return (self.log / "broker.log").read_text(errors="replace").count("Failed authentication")

    def jvms(self) -> list[int]:
        return descendants(self.proc.pid)


STARTED = re.compile(rb"SASL_SSL \(SCRAM-SHA-512\) on (\S+), CA (\S+), data in")


@contextlib.contextmanager
def sasl_broker(work: Path, password: str) -> Iterator[SaslBroker]:
    """The broker as docs/kafka.md starts it: ``streamgroup local kafka --sasl-user NAME``, the password in
    ``STREAMGROUP_KAFKA_SASL_PASSWORD``; stopped as Ctrl-C stops it."""
    port, data, out = free_port(), work / "kafka", work / "streamgroup-local-kafka.log"
    command = [CLI, "local", "kafka", "--port", str(port), "--data", str(data), "--sasl-user", location.SASL_USERNAME]
    with out.open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, SASL_PASSWORD_ENV: password}, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        found = wait_for("the broker's start line", lambda: STARTED.search(out.read_bytes()) or proc.poll(), 180.0)
        assert isinstance(found, re.Match), out.read_text(errors="replace")
        bootstrap = f"127.0.0.1:{port}"
        wait_until_answering(bootstrap, 60)
        yield SaslBroker(bootstrap, found.group(1).decode(), Path(found.group(2).decode()), data, proc)
    finally:
        gc.collect()  # clients kept by reference cycles would log refused connections once the broker is gone
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            for pid in descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)


@dataclass(frozen=True)
class StateDatabase:
    admin_url: str
    role: str
    database: str

    def url(self, password: str, **query: str) -> str:
        """The store URL with the password in its user info (and ``query`` parameters, quoted)."""
        admin = make_url(self.admin_url)
        return URL.create(
            "postgresql", username=self.role, password=password, host=admin.host, port=admin.port,
            database=self.database, query=query,
        ).render_as_string(hide_password=False)  # fmt: skip

    def query_url(self, password: str) -> str:
        """The store URL with the password as a query parameter (psycopg reads it there)."""
        admin = make_url(self.admin_url)
        return f"postgresql://{self.role}@{admin.host}:{admin.port}/{self.database}?password={quote(password, safe='')}"

    def dsn(self, password: str) -> str:
        """A libpq keyword DSN: a form no store opens (the password quoted as libpq wants it)."""
        admin = make_url(self.admin_url)
        quoted = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return f"host={admin.host} port={admin.port} dbname={self.database} user={self.role} password={quoted}"

    def mistyped(self, password: str) -> dict[str, str]:
        """URLs a user mistypes, the password in them as written: a slash short, the password not encoded."""
        admin = make_url(self.admin_url)
        where = f"{admin.host}:{admin.port}/{self.database}"
        return {
            "a slash short": f"postgresql:/{self.role}:{quote(password, safe='')}@{where}",
            "the password not encoded": f"postgresql://{self.role}:{password}@{where}",
        }


def state_database(admin_url: str, password: str) -> StateDatabase:
    """A login role and database of the group state's own (only the password's SCRAM verifier reaches the
    server), so nothing in the search can come from the shared superuser's URL."""
    name = f"sg_secrets_{uuid.uuid4().hex[:8]}"
    provision_database(admin_url, password, role=name, database=name)
    return StateDatabase(admin_url, name, name)


def write_secret_file(directory: Path, value: str) -> None:
    """Replace the mounted password file in one rename, as a secret volume's update does."""
    target = directory / location.SASL_PASSWORD_FILE
    fd, tmp = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    os.replace(tmp, target)


# What the test drives: the CLI, runs, progress.


@dataclass
class CliResult:
    name: str
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_cli(commands: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, CliResult]:
    """``streamgroup`` commands side by side (each loads the definitions; some wait on a refused login)."""
    started = {
        name: subprocess.Popen(
            [CLI, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, (args, env) in commands.items()
    }
    results = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=240)
        results[name] = CliResult(name, commands[name][0], proc.returncode, out, err)
    return results


def group_runs(dev: DagsterDev, group: str) -> list[dict[str, Any]]:
    return [r for r in dev.runs() if r["tags"].get(TAG_GROUP) == group]


def caught_up(resource: StreamGroupResource) -> bool:
    """The offsets the group mirrored into the stream are at every shard's high watermark."""
    return committed_at_high(resource) is not None


def kafka_resource(
    broker: SaslBroker, group: str, topic: str, password: str, store_url: str | None = None
) -> KafkaStreamGroup:
    return KafkaStreamGroup(
        group=group,
        store_url=store_url,
        bootstrap_servers=broker.address,
        topics=[topic],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=location.SASL_USERNAME,
        sasl_password=password,
        ssl_ca_location=str(broker.ca_file),
    )


def produce_kafka(broker: SaslBroker, topic: str, password: str, count: int, seed: int) -> None:
    bulk, trailer = producers(broker.client_config(password).client_config())
    produce_burst(bulk, trailer, topic, PARTITIONS, count, random.Random(seed))


# The search itself can fail: a planted secret is reported wherever it hides.


def test_search_reports_a_planted_secret(tmp_path: Path) -> None:
    secret = new_secret()
    evidence = Evidence()
    evidence.add("clean log", "INFO a line with nothing to hide")
    assert find_secrets(evidence, {"planted": secret}) == []
    evidence.add("a log line", f"ERROR connect failed with password={secret}")
    evidence.add("a debug dump", f"header: {needles(secret)['base64@1'].decode()}")
    evidence.add("a URL", f"postgresql://u:{quote(secret, safe='')}@h/db")
    evidence.add("a JSON document", json.dumps({"detail": f"password {secret}"}).replace("/", "\\/"))
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "events.db").write_bytes(b"\x00\x01" + secret.encode().hex().encode() + b"\x02")
    evidence.add_tree(tmp_path)
    found = {(f.where, f.encoding) for f in find_secrets(evidence, {"planted": secret})}
    assert ("a log line", "raw") in found
    assert any(where == "a debug dump" and enc.startswith("base64") for where, enc in found)
    assert ("a URL", "url-quoted") in found  # the secret has punctuation: quoted, it is another string
    assert ("a JSON document", "json, / escaped") in found
    assert (str(tmp_path / "nested" / "events.db"), "hex") in found


def test_search_reads_compressed_values_of_sqlite_databases(tmp_path: Path) -> None:
    """Dagster keeps its job snapshots zlib-compressed in SQLite: a byte search of the file alone misses them."""
    secret = new_secret()
    with contextlib.closing(sqlite3.connect(tmp_path / "runs.db")) as db:
        db.execute("CREATE TABLE snapshots (id TEXT, body BLOB)")
        db.execute("INSERT INTO snapshots VALUES (?, ?)", ("s1", zlib.compress(f'{{"password": "{secret}"}}'.encode())))
        db.commit()
    on_disk = Evidence()
    on_disk.add_tree(tmp_path)
    assert find_secrets(on_disk, {"planted": secret}) == []
    decompressed = Evidence()
    assert sqlite_evidence(tmp_path, decompressed)["decompressed"] == 1
    assert [f.encoding for f in find_secrets(decompressed, {"planted": secret})] == ["raw"]


@pytest.mark.parametrize("shift", [0, 1, 2])
def test_base64_needles_match_the_secret_inside_a_longer_encoding(shift: int) -> None:
    import base64

    secret = new_secret()
    encoded = base64.b64encode(b"user\0" + b"x" * shift + secret.encode() + b"\0tail")
    assert any(needle in encoded for name, needle in needles(secret).items() if name.startswith("base64@"))


def _snapshot_of(resources: dict[str, Any]) -> str:
    """What a code location serves the webserver (the Resources page) and what runs store with their job
    snapshot: the definitions' snapshot, with each resource's configured values."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    @dg.asset(required_resource_keys=set(resources))
    def uses_them() -> None:
        """Only here to make the resources part of the definitions."""

    repository = dg.Definitions(assets=[uses_them], resources=resources).get_repository_def()
    return serialize_value(RepositorySnap.from_def(repository))


def test_literal_secrets_are_refused_at_load_env_vars_reach_the_snapshot_as_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why the docs say dg.EnvVar or a mounted file, never a literal: Dagster keeps a resource's configured values
    in the snapshot it shows and stores. That was the one way found to make the deployment leak a secret; a
    literal is now refused when the definitions load, naming the field and never the value."""
    values = {"sasl": new_secret(), "postgres": new_secret(), "v3io": new_secret()}
    kafka: dict[str, Any] = {
        "group": "g", "bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN", "sasl_username": "svc",
    }  # fmt: skip
    v3io: dict[str, Any] = {
        "group": "g_v3io", "endpoint": "http://127.0.0.1:8081", "container": "c", "stream_path": "s",
    }  # fmt: skip
    store_url = f"postgresql://u:{quote(values['postgres'], safe='')}@h:5432/db"
    literals = {
        "sasl_password": {"kafka": KafkaStreamGroup(**kafka, sasl_password=values["sasl"])},
        "store_url": {"kafka": KafkaStreamGroup(**kafka, sasl_password=dg.EnvVar("SASL_PW"), store_url=store_url)},
        "access_key": {"v3io": V3ioStreamGroup(**v3io, access_key=values["v3io"], store_url="v3io")},
    }
    for field, resources in literals.items():
        with pytest.raises(LiteralSecretError) as caught:
            _snapshot_of(resources)
        refused = Evidence()
        refused.add(f"the error of a literal {field}", str(caught.value))
        assert field in str(caught.value) and find_secrets(refused, values) == [], str(caught.value)
    for name, value in {"SASL_PW": values["sasl"], "STORE_URL": store_url, "V3IO_KEY": values["v3io"]}.items():
        monkeypatch.setenv(name, value)
    from_env = _snapshot_of(
        {
            "kafka": KafkaStreamGroup(**kafka, sasl_password=dg.EnvVar("SASL_PW"), store_url=dg.EnvVar("STORE_URL")),
            "v3io": V3ioStreamGroup(**v3io, access_key=dg.EnvVar("V3IO_KEY"), store_url="v3io"),
        }
    )
    hidden = Evidence()
    hidden.add("snapshot, dg.EnvVar", from_env)
    assert find_secrets(hidden, values) == []
    assert "SASL_PW" in from_env and "STORE_URL" in from_env  # the variables' names are what it keeps


def test_search_refuses_a_secret_too_short_to_search() -> None:
    with pytest.raises(ValueError, match="too short"):
        find_secrets(Evidence(), {"pin": "1234"})


# The deployment.


KEEP_ENV = "STREAMGROUP_SECRETS_KEEP"


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """A fresh directory; kept (and printed) with ``STREAMGROUP_SECRETS_KEEP=1``, to read the logs after a failure."""
    tmp = Path(tempfile.mkdtemp(prefix="streamgroup-secrets-"))
    try:
        yield tmp
    finally:
        if os.environ.get(KEEP_ENV) == "1":
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def set_role_password(database: StateDatabase, password: str) -> None:
    """Rotate the state role's password on the server (only its SCRAM verifier is sent)."""
    admin = make_url(database.admin_url)
    conninfo = psycopg.conninfo.make_conninfo(
        host=admin.host, port=admin.port, user=admin.username, password=admin.password, dbname=admin.database,
        connect_timeout=10,
    )  # fmt: skip
    with psycopg.connect(conninfo, autocommit=True) as conn:
        verifier = conn.pgconn.encrypt_password(password.encode(), database.role.encode(), b"scram-sha-256").decode()
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(database.role), sql.Literal(verifier)))


def dead_letters_of(resource: StreamGroupResource) -> list[str]:
    """The group's unresolved dead letters, from its state: each range with its reason."""
    return [f"{d.shard} [{d.start}, {d.end}): {d.reason}" for d in group_state(resource).dead_letters]


@overload
def new_failed_run(dev: DagsterDev, group: str, before: set[str]) -> dict[str, Any]: ...


@overload
def new_failed_run(
    dev: DagsterDev, group: str, before: set[str], *, member_sensor: str, since: float
) -> dict[str, Any] | None: ...


def new_failed_run(
    dev: DagsterDev, group: str, before: set[str], *, member_sensor: str | None = None, since: float = 0.0
) -> dict[str, Any] | None:
    """A run of ``group`` that failed and is not in ``before``; with ``member_sensor``, None once that member's
    own tick (after ``since``) was refused the SASL login instead."""
    timeout_s = 300.0

    def failed() -> dict[str, Any] | tuple[()] | None:
        runs = group_runs(dev, group)
        run = next((r for r in runs if r["runId"] not in before and r["status"] == "FAILURE"), None)
        if run is None and member_sensor is not None and tick_refused_login(dev, member_sensor, since):
            return ()
        return run

    try:
        found = wait_for(f"a failed run of group {group}", failed, timeout_s, 1.0)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{deployment_report(dev, group)}") from exc
    return found or None


def tick_refused_login(dev: DagsterDev, sensor: str, since: float) -> bool:
    """Whether a tick of ``sensor`` after ``since`` (seconds since the epoch) failed on a refused SASL login."""
    fields = "sensorState { ticks(limit: 50) { timestamp skipReason error { message causes { message } } } }"
    ticks = dev.sensor(sensor, fields)["sensorState"]["ticks"]
    return any(
        tick["timestamp"] > since and "refused the SASL login" in json.dumps([tick["skipReason"], tick["error"]])
        for tick in ticks
    )


def deployment_report(dev: DagsterDev, group: str, lines: int = 80) -> str:
    """What a failure needs to be understood where the work folder is gone: the group's runs and the newest lines
    of ``dagster dev``'s log (librdkafka's repeated login errors left out). The secrets are new for each run and
    the log is searched for them at the end of the test, so a line here holds none a later step would catch."""
    runs = [(r["runId"][:8], r["status"], r["creationTime"], r["endTime"]) for r in group_runs(dev, group)]
    log = [line for line in dev.log.read_text(errors="replace").splitlines() if not line.startswith("%")]
    tail = "\n".join(line[:400] for line in log[-lines:])
    return f"runs of {group} (id, status, created, ended): {runs}\nthe last {lines} lines of {dev.log.name}:\n{tail}"


@pytest.mark.kafka
@pytest.mark.v3io
@pytest.mark.postgres
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.timeout(900)
def test_no_secret_in_logs_tags_events_errors_or_files(postgres_url: str, work_dir: Path) -> None:
    values = {
        "sasl_password": new_secret(),
        "sasl_password_rotated": new_secret(),
        "v3io_access_key": new_secret(),
        "postgres_password": new_secret(),
        "postgres_sslpassword": new_secret(),
        "postgres_password_rotated": new_secret(),
        "postgres_password_wrong": new_secret(),
        "sasl_password_wrong": new_secret(),
        "v3io_access_key_wrong": new_secret(),
    }
    home, output, secret_dir = work_dir / "home", work_dir / "output", work_dir / "mounted-secrets"
    secret_dir.mkdir()
    write_secret_file(secret_dir, values["sasl_password"])
    database = state_database(postgres_url, values["postgres_password"])
    group, topic = f"secrets_{uuid.uuid4().hex[:8]}", f"clicks-{uuid.uuid4().hex[:8]}"
    v3io_group, stream_path = f"{group}_v3io", f"clicks_{uuid.uuid4().hex[:8]}"
    yaml_group, yaml_topic = f"{group}_yaml", f"{topic}-yaml"  # the component's group (component_defs/)
    evidence = Evidence()
    counts: dict[str, Any] = {}
    started = time.monotonic()

    def elapsed() -> str:
        return f"{time.monotonic() - started:.0f} s"

    with contextlib.ExitStack() as stack:
        # What any local user sees with `ps`, from the first process the test starts to the last.
        sampler = stack.enter_context(CommandLineSampler(interval_s=0.1))
        broker = stack.enter_context(sasl_broker(work_dir, values["sasl_password"]))
        counts["environments of the broker's JVM"] = add_environments(evidence, "the broker's JVM", broker.jvms())
        stack.callback(release_cached_clients)  # before the servers stop: a client left would reconnect
        v3io_server = V3ioServerProcess(work_dir / "v3io-server", access_key=values["v3io_access_key"])
        info = v3io_server.start()
        stack.callback(v3io_server.stop)
        # The Connect server with its UI and event log on, as an operator runs one: both show each statement's
        # plan, the sources' options included (the session's string redaction must hide the secret ones).
        spark_events, ui_port = work_dir / "spark-events", free_port()
        spark_events.mkdir()
        ui_and_log = {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port), "spark.ui.host": "127.0.0.1",
                 "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(spark_events)}  # fmt: skip
        connect = stack.enter_context(
            running_connect_server(
                settings=ConnectServerSettings(master="local[2]", driver_memory="1g", conf=ui_and_log)
            )
        )

        # Data on both streams before the deployment starts.
        create_topics(
            broker.client_config(values["sasl_password"]).client_config(), {topic: PARTITIONS, yaml_topic: PARTITIONS}
        )
        produce_kafka(broker, topic, values["sasl_password"], RECORDS, seed=1)
        produce_kafka(broker, yaml_topic, values["sasl_password"], RECORDS, seed=7)
        client = v3io_client(info.endpoint, values["v3io_access_key"])
        stack.callback(client.close)
        shards = ensure_v3io_stream(client, V3IO_CONTAINER, stream_path, PARTITIONS)
        produce_v3io_burst(client, V3IO_CONTAINER, stream_path, shards, RECORDS, random.Random(2))
        v3io = V3ioStreamGroup(
            group=v3io_group, endpoint=info.endpoint, container=V3IO_CONTAINER, stream_path=stream_path,
            access_key=values["v3io_access_key"], store_url="v3io",
        )  # fmt: skip

        env = {
            "CLICKSTREAM_STREAM": "kafka",
            "CLICKSTREAM_GROUP": group,
            "CLICKSTREAM_BOOTSTRAP": broker.address,
            location.SSL_CA_ENV: str(broker.ca_file),
            "CLICKSTREAM_TOPIC": topic,
            "CLICKSTREAM_V3IO_API": info.endpoint,
            "CLICKSTREAM_V3IO_CONTAINER": V3IO_CONTAINER,
            "CLICKSTREAM_V3IO_STREAM_PATH": stream_path,
            "CLICKSTREAM_MEMBERS": "1",
            "CLICKSTREAM_HEARTBEAT_S": "3",
            "CLICKSTREAM_SESSION_TIMEOUT_S": "15",
            "CLICKSTREAM_MIN_BACKLOG": "1",
            "CLICKSTREAM_MAX_WAIT_S": "0",
            "CLICKSTREAM_OUTPUT": str(output),
            "CLICKSTREAM_SPARK_REMOTE": connect.remote,  # the example's default: runs attach to a Connect server
            # The secrets, as docs/kafka.md and docs/dagster.md have them given:
            location.SECRET_PATH_ENV: str(secret_dir),
            location.STORE_URL_ENV: database.url(
                values["postgres_password"], sslpassword=values["postgres_sslpassword"]
            ),
            location.V3IO_KEY_ENV: values["v3io_access_key"],
            # The component's group: its password from `{env: NAME}` in its defs.yaml, its store's in the query.
            location.COMPONENT_GROUP_ENV: yaml_group,
            location.COMPONENT_TOPIC_ENV: yaml_topic,
            location.COMPONENT_PASSWORD_ENV: values["sasl_password"],
            location.COMPONENT_STORE_URL_ENV: database.query_url(values["postgres_password"]),
            # The refused location's group: its store URL a keyword DSN, the password in it.
            location.REFUSED_GROUP_ENV: f"{group}_refused",
            location.REFUSED_TOPIC_ENV: topic,
            location.REFUSED_BOOTSTRAP_ENV: broker.bootstrap,
            location.REFUSED_STORE_URL_ENV: database.dsn(values["postgres_password"]),
        }
        dev_log = work_dir / "dagster-dev.log"
        dev = DagsterDev(home, env, dev_log, workspace=WORKSPACE)
        stack.callback(dev.close)
        dev.start()

        # 1. Runs succeed on both streams and in the component's group: the SASL login, the key and the
        #    PostgreSQL store all work.
        kafka = kafka_resource(broker, group, topic, values["sasl_password"])
        yaml_kafka = kafka_resource(broker, yaml_group, yaml_topic, values["sasl_password"])
        wait_for(
            "the three groups to drain",
            lambda: caught_up(kafka) and caught_up(v3io) and caught_up(yaml_kafka),
            300.0,
            2.0,
        )
        runs = ended_runs(dev)
        assert {r["status"] for r in runs} == {"SUCCESS"}, runs
        assert {r["tags"][TAG_GROUP] for r in runs} == {group, v3io_group, yaml_group}
        print(f"the three groups drained, {elapsed()} after the start", flush=True)

        # 2. The SASL password is rotated on the broker while the deployment still holds the old one: the
        #    members' logged-in connections stay open, the next run logs in anew and is refused; its range
        #    becomes a dead letter with the run's error. A member that had to log in again (its code server
        #    started again, a failed request replaced its client) is refused too, and launches nothing until
        #    the secret is updated: the test takes either, and says which. The mounted secret is updated, and the
        #    next range's run logs in with the new password and commits.
        before = {r["runId"] for r in runs}
        rotated_at = time.time()
        broker.rotate(values["sasl_password_rotated"])
        produce_kafka(broker, topic, values["sasl_password_rotated"], RECORDS // 2, seed=3)
        refused = new_failed_run(dev, group, before, member_sensor=f"{group}_member_0", since=rotated_at)
        write_secret_file(secret_dir, values["sasl_password_rotated"])
        assert broker.refused > 0, "no login was refused: neither a run nor the member failed on the rotated password"
        kafka = kafka_resource(broker, group, topic, values["sasl_password_rotated"])
        produce_kafka(broker, topic, values["sasl_password_rotated"], RECORDS // 2, seed=4)
        wait_for("a run after the secret update", lambda: caught_up(kafka), 300.0, 2.0)
        if refused is None:
            print(f"the member's own login was refused on the rotated SASL password: {elapsed()}", flush=True)
        else:
            print(f"run {refused['runId']} failed on the rotated SASL password: {elapsed()}", flush=True)

        # 3. The state database's password is rotated while the deployment holds the old one: a run (a new
        #    process, new connections) cannot reach the store, in either group of the role: the Kafka group's URL
        #    holds the password in its user info (and ?sslpassword=), the component's in ?password=. Rotated back,
        #    the Kafka group's next run commits (the component's group still has the old SASL password).
        before = {r["runId"] for r in ended_runs(dev)}
        set_role_password(database, values["postgres_password_rotated"])
        produce_kafka(broker, topic, values["sasl_password_rotated"], RECORDS // 2, seed=5)
        produce_kafka(broker, yaml_topic, values["sasl_password_rotated"], RECORDS // 2, seed=8)
        store_failure = new_failed_run(dev, group, before)
        yaml_failure = new_failed_run(dev, yaml_group, before)
        set_role_password(database, values["postgres_password"])
        produce_kafka(broker, topic, values["sasl_password_rotated"], RECORDS // 2, seed=6)
        wait_for("a run after the store came back", lambda: caught_up(kafka), 300.0, 2.0)
        after = [r for r in ended_runs(dev) if r["runId"] not in before and r["tags"].get(TAG_GROUP) == group]
        assert "SUCCESS" in {r["status"] for r in after}, after
        print(
            f"runs {store_failure['runId']} and {yaml_failure['runId']} failed on the rotated store password: "
            f"{elapsed()}",
            flush=True,
        )

        counts["graphql"] = graphql_evidence(
            dev, evidence, ["page_views_per_minute", location.V3IO_ASSET, location.COMPONENT_ASSET]
        )
        dev.stop()

        # 4. The CLI with the deployment's configuration, then with bad ones.
        cli_env = {**dev.env, "PYTHONPATH": str(ROOT)}
        wrong_secret_dir = work_dir / "wrong-secrets"
        wrong_secret_dir.mkdir()
        write_secret_file(wrong_secret_dir, values["sasl_password_wrong"])
        definitions = ["--definitions", str(DEFINITIONS)]
        shard = f"{topic}:0"
        dry_run = [
            "backfill",
            "--group",
            group,
            "--shard",
            shard,
            "--from",
            "0",
            "--to",
            "100",
            "--no-align",
            "--dry-run",
        ]
        bad_port_url = database.url(values["postgres_password_wrong"]).replace(
            f":{make_url(postgres_url).port}/", ":notaport/"
        )
        refused_urls = {
            "a keyword DSN": database.dsn(values["postgres_password"]),
            **database.mistyped(values["postgres_password"]),
        }
        cli = run_cli(
            {
                "status": (["status", "--group", group, *definitions], cli_env),
                "status v3io": (["status", "--group", v3io_group, *definitions], cli_env),
                "status yaml": (
                    ["status", "--group", yaml_group, *definitions],
                    {**cli_env, location.COMPONENT_PASSWORD_ENV: values["sasl_password_rotated"]},
                ),
                "backfill --dry-run": ([*dry_run, *definitions], cli_env),
                "status, wrong store password": (
                    ["status", "--group", group, *definitions],
                    {**cli_env, location.STORE_URL_ENV: database.url(values["postgres_password_wrong"])},
                ),
                "status, store URL with a bad port": (
                    ["status", "--group", group, *definitions],
                    {**cli_env, location.STORE_URL_ENV: bad_port_url},
                ),
                **{
                    f"status, store URL as {form}": (
                        ["status", "--group", group, *definitions],
                        {**cli_env, location.STORE_URL_ENV: url},
                    )
                    for form, url in refused_urls.items()
                },
                "status, wrong SASL password": (
                    ["status", "--group", group, *definitions],
                    {**cli_env, location.SECRET_PATH_ENV: str(wrong_secret_dir)},
                ),
                "status v3io, wrong access key": (
                    ["status", "--group", v3io_group, *definitions],
                    {**cli_env, location.V3IO_KEY_ENV: values["v3io_access_key_wrong"]},
                ),
            }
        )
        # The failed runs' ranges, as dead letters: how many depends on what each run held when it was planned
        # (a tick between the producer's partitions plans one range, the next tick the other).
        store_url = database.url(values["postgres_password"])
        state_store = kafka_resource(broker, group, topic, values["sasl_password_rotated"], store_url)
        dead_letters = dead_letters_of(state_store)
        for run in (refused, store_failure):  # at least one range of each failed run, given up after one attempt
            assert run is None or any(run["runId"] in letter for letter in dead_letters), (run, dead_letters)
        cli.update(run_cli({"resolve": (["resolve", "--group", group, *definitions], cli_env)}))
        for result in cli.values():
            evidence.add(f"cli: {result.name}: stdout", result.stdout)
            evidence.add(f"cli: {result.name}: stderr", result.stderr)
            print(f"--- streamgroup {result.name}: exit {result.returncode}\n{result.stdout}{result.stderr}")
        print(f"CLI done: {elapsed()}", flush=True)

        # 5. Everything the deployment wrote and stored: logs (dagster dev, compute logs, the Spark Connect
        #    server's), Dagster's storages, the group states (PostgreSQL; the KV item next to the v3io stream),
        #    the output; searched while the Connect server's scratch directory still exists.
        counts["spark connect ui"] = spark_ui_evidence(f"http://127.0.0.1:{ui_port}", evidence)
        counts["event log storage"] = instance_evidence(home, evidence)
        counts["group state database"] = database_evidence(postgres_url, database.database, evidence)
        counts["sqlite"] = sqlite_evidence(home, evidence)
        tables = counts["sqlite"]["tables"]
        counts["group states, bytes"] = [state_evidence(state_store, evidence), state_evidence(v3io, evidence)]
        counts["v3io server sqlite"] = sqlite_evidence(work_dir / "v3io-server", evidence)
        for place in (home, output, dev_log, connect.scratch, work_dir / "v3io-server", broker.log):
            evidence.add_tree(place)
        evidence.add_tree(work_dir / "streamgroup-local-kafka.log")  # what `streamgroup local kafka` printed
        sampler.sample()
        sampler.add_to(evidence)
        counts["processes"] = {"command lines": len(sampler.lines), "samples": sampler.samples}
        compute_logs = [p for p in evidence.files if p.suffix in {".out", ".err"} and home in p.parents]
        counts["logs"] = {
            "dagster dev lines": dev_log.read_text(errors="replace").count("\n"),
            "compute log files": len(compute_logs),
            "spark connect server lines": connect.log_path.read_text(errors="replace").count("\n"),
        }
        findings = find_secrets(evidence, values)
        print(f"searched {evidence.summary()}: {counts}; {elapsed()}", flush=True)

        # 6. The same search finds a secret planted in a run tag of (a copy of) this instance.
        planted_home = work_dir / "planted-home"
        shutil.copytree(home, planted_home)
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(planted_home))) as instance:
            instance.add_run_tags(store_failure["runId"], {"planted": values["sasl_password"]})
        planted = Evidence()
        instance_evidence(planted_home, planted)
        sqlite_evidence(planted_home, planted)
        planted.add_tree(planted_home)
        planted_findings = find_secrets(planted, {"sasl_password": values["sasl_password"]})

    # The Connect server's event log, complete once the server stopped (it compresses in blocks).
    spark_log = Evidence()
    counts["spark event logs"] = event_log_evidence(spark_events, spark_log)
    spark_log_findings = find_secrets(spark_log, values)

    found_where = {(f.where, f.encoding) for f in planted_findings}
    assert ("event log storage: runs", "raw") in found_where, describe(planted_findings)
    assert any(f.where.endswith("runs.db") for f in planted_findings), describe(planted_findings)

    assert not findings, f"secrets found:\n{describe(findings)}"
    assert not spark_log_findings, f"secrets found:\n{describe(spark_log_findings)}"

    # Every place the search read was read here: Dagster's tables, each process's command line (the
    # broker's format step among them), the broker's JVM's environment.
    assert all(tables.get(t, 0) > 0 for t in ("runs", "snapshots", "event_logs", "job_ticks")), tables
    assert counts["environments of the broker's JVM"] >= 1, counts
    assert any(b"kafka.tools.StorageTool" in line for line in sampler.lines), counts["processes"]

    # The error paths searched above were taken: the broker's refusal and the store's refusal are in the runs'
    # events, and each CLI command ended as it should.
    shown = b"".join(evidence.texts.values())
    assert location.STORE_URL_ENV.encode() in shown  # the resources' configuration, from the decompressed snapshots
    assert location.COMPONENT_PASSWORD_ENV.encode() in shown  # the component's password: a variable's name only
    # The Connect server's UI and event log hold the runs' statements (their options' names are there), and
    # the secret ones redacted.
    ui = b"".join(t for where, t in evidence.texts.items() if where.startswith("spark ui: /connect/"))
    assert b"kafka.bootstrap.servers" in ui and b"redacted" in ui, counts["spark connect ui"]
    events = b"".join(spark_log.texts.values())
    assert b"kafka.bootstrap.servers" in events and b"redacted" in events, counts["spark event logs"]
    assert b"password authentication failed" in shown
    refusals = (b"All broker connections are down", b"Authentication failed", b"refused the SASL login")
    assert any(text in shown for text in refusals)
    assert cli["status"].returncode == 0 and group in cli["status"].stdout, cli["status"]
    assert "dead letters" in cli["status"].stdout and "failed 1 time(s)" in cli["status"].stdout, cli["status"]
    resolved = f"{len(dead_letters)} dead letter(s) resolved"  # every range of the two failed runs
    assert cli["resolve"].returncode == 0 and resolved in cli["resolve"].stdout, cli["resolve"]
    assert cli["status v3io"].returncode == 0 and v3io_group in cli["status v3io"].stdout, cli["status v3io"]
    assert cli["status yaml"].returncode == 0 and yaml_group in cli["status yaml"].stdout, cli["status yaml"]
    assert cli["backfill --dry-run"].returncode == 0 and f"{shard} [0, 100)" in cli["backfill --dry-run"].stdout
    for name in ("status, wrong store password", "status, wrong SASL password", "status v3io, wrong access key"):
        assert cli[name].returncode != 0, cli[name]
    bad_port = cli["status, store URL with a bad port"]
    assert bad_port.returncode != 0 and "store_url" in bad_port.stderr, bad_port
    for form in refused_urls:  # refused when the definitions load, naming the field and its variable
        result = cli[f"status, store URL as {form}"]
        assert result.returncode != 0 and location.STORE_URL_ENV in result.stderr, result
    # The refused location did not load: one error, naming the field and the variable, the DSN shown redacted.
    load_errors = "".join(t.decode(errors="replace") for w, t in evidence.texts.items() if w.startswith("graphql: "))
    assert location.REFUSED_STORE_URL_ENV in load_errors and "password=***" in load_errors, counts["graphql"]
    assert counts["graphql"]["locations not loaded"] == [location.REFUSED_LOCATION], counts["graphql"]
    # The store errors of both URL forms were shown (redacted) where the failed runs' events are.
    assert b"?sslpassword=***" in shown and b"?password=***" in shown
    logs = counts["logs"]
    assert logs["compute log files"] > 0 and logs["spark connect server lines"] > 0, counts
    assert counts["graphql"]["run_events"] > 0 and counts["group state database"]["rows"] > 0, counts
