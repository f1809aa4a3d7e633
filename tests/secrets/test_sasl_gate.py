"""The SASL/PLAIN gate the secrets test puts in front of the local broker: its Kafka messages, a real login
through it with confluent-kafka, and why it exists (the local broker keeps no SCRAM credentials)."""

from __future__ import annotations

import gc
import struct
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # listed, not re-exported, by the package
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from dagster_streamgroup.local.kafka_broker import broker_binary, free_port, running_broker, stop, wait_until_answering
from tests.secrets.sasl_gate import (
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SaslPlainGate,
    authenticate_bytes,
    authenticate_response,
    parse_request_header,
    plain_credentials,
    put_uvarint,
)


def _header(api_key: int, version: int, correlation_id: int, client_id: bytes, flexible: bool) -> bytes:
    out = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    return out + (put_uvarint(0) if flexible else b"")


@pytest.mark.parametrize("version", [0, 1, 2])
def test_sasl_authenticate_request_is_read_in_every_version(version: int) -> None:
    token = b"\0alice\0s3cret"
    flexible = version >= 2
    body = put_uvarint(len(token) + 1) + token + put_uvarint(0) if flexible else struct.pack(">i", len(token)) + token
    frame = _header(SASL_AUTHENTICATE, version, 7, b"rdkafka", flexible) + body
    header = parse_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id) == (SASL_AUTHENTICATE, version, 7)
    assert plain_credentials(authenticate_bytes(frame, header)) == ("alice", "s3cret")


@pytest.mark.parametrize("version", [0, 1, 2])
def test_sasl_authenticate_refusal_carries_kafkas_error_code(version: int) -> None:
    frame = _header(SASL_AUTHENTICATE, version, 9, b"c", version >= 2) + b"\0\0\0\0"
    response = authenticate_response(parse_request_header(frame), SASL_AUTHENTICATION_FAILED, "bad login")
    offset = 4 + (1 if version >= 2 else 0)  # correlation id, then the flexible header's empty tag buffer
    assert struct.unpack_from(">i", response)[0] == 9
    assert struct.unpack_from(">h", response, offset)[0] == SASL_AUTHENTICATION_FAILED
    assert b"bad login" in response


@pytest.fixture
def gated_broker() -> Iterator[SaslPlainGate]:
    port = free_port()
    gate = SaslPlainGate(("127.0.0.1", port), "svc", "first-password")
    proc = subprocess.Popen(
        [broker_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://{gate.address}", "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until_answering(f"127.0.0.1:{port}", 20.0, proc)
        gc.collect()  # its probe client, kept by a reference cycle, would retry the gate unauthenticated
        yield gate
    finally:
        # Clients kept alive by reference cycles (a failed probe's traceback holds its frame) would log
        # refused connections once the broker is gone: collect them first.
        gc.collect()
        gate.close()
        stop(proc.pid)


def _admin(gate: SaslPlainGate, password: str) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": gate.address,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": password,
            "log_level": 0,  # the refused logins below are expected
        }
    )


@pytest.mark.kafka
def test_gate_admits_the_password_refuses_others_and_keeps_sessions_over_a_rotation(
    gated_broker: SaslPlainGate,
) -> None:
    gate = gated_broker
    logged_in = _admin(gate, "first-password")
    assert logged_in.list_topics(timeout=10).brokers
    with pytest.raises(KafkaException):
        _admin(gate, "wrong-password").list_topics(timeout=3)
    assert gate.refused > 0
    gate.rotate("second-password")
    with pytest.raises(KafkaException):
        _admin(gate, "first-password").list_topics(timeout=3)
    assert _admin(gate, "second-password").list_topics(timeout=10).brokers
    assert logged_in.list_topics(timeout=10).brokers  # logged in before the rotation: still served


@pytest.mark.kafka
def test_the_local_broker_keeps_no_scram_credentials() -> None:
    """Why the gate exists. If this fails, the local broker stores SCRAM users now: log in to it directly
    (``--authentication``) and drop the gate."""
    with running_broker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        upsert = UserScramCredentialUpsertion("svc", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"pw")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            assert future.result() is None  # accepted ...
        described = admin.describe_user_scram_credentials()  # every user: one future
        assert isinstance(described, Future) and described.result() == {}  # ... yet nobody is listed afterwards
        del admin, described
        gc.collect()  # before the broker stops (see gated_broker)
