"""Secrets in every form a user writes them, where the definitions load: a state store URL with its password in
the user info, in a query parameter (``password``, ``sslpassword``, ...), as a libpq keyword DSN or mistyped,
given as ``dg.EnvVar`` or as a literal; a literal SASL password, key password, client secret, v3io access key
or Spark Connect token in Python definitions.

What must hold: a bad URL is one error when the code location loads (an ``EnvVar``'s value is known then), naming
the field and the variable; a literal secret is refused at load, naming the field and pointing to ``dg.EnvVar``
or a mounted file; no error, ``repr`` or store message ever holds a piece of the secret."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupConfigError, StreamSparkResource, V3ioStreamGroup
from dagster_streamgroup.dagster.literal_secrets import LiteralSecretError
from dagster_streamgroup.local.kafka_broker import free_port
from dagster_streamgroup.redact import MASK
from dagster_streamgroup.stores.base import StoreConfigError, StoreUnavailableError
from dagster_streamgroup.stores.factory import SUPPORTED, check_store_url, open_store
from tests.unit.test_connection_redaction import keyword_dsns, leaked, mistyped_urls, postgres_urls

CONFIG_ERRORS = (
    ValidationError,
    StreamGroupConfigError,
    dg.DagsterInvalidConfigError,
    StoreConfigError,
    LiteralSecretError,
)


def new_secret() -> str:
    return "Sg" + secrets.token_urlsafe(18)


def shows_a_piece(text: str, secret: str, width: int = 6) -> bool:
    """Whether ``text`` holds ``secret`` or any ``width`` characters of it in a row."""
    return any(secret[i : i + width] in text for i in range(max(1, len(secret) - width + 1)))


# The forms: {pw} is the secret; those accepted hold it where PostgreSQL's drivers read a password.
ACCEPTED = {
    "user info": "postgresql://svc:{pw}@127.0.0.1:{port}/state",
    "password parameter": "postgresql://svc@127.0.0.1:{port}/state?password={pw}&sslmode=disable",
    "sslpassword parameter": "postgresql+psycopg://svc:{pw}@127.0.0.1:{port}/state?sslpassword={pw}",
    "oauth_client_secret parameter": "postgres://svc@127.0.0.1:{port}/state?oauth_client_secret={pw}",
}
REFUSED = {
    "keyword DSN": "host=127.0.0.1 port={port} dbname=state user=svc password={pw}",
    "a slash short": "postgresql:/svc:{pw}@127.0.0.1:{port}/state",
    "no colon": "postgresql//svc:{pw}@127.0.0.1:{port}/state",
    "a port that is no number": "postgresql://svc:{pw}@127.0.0.1:port{port}/state",
    "an unencoded @ in the password": "postgresql://svc:{pw}@x@127.0.0.1:{port}/state",
    "a misspelt parameter": "postgresql://svc@127.0.0.1:{port}/state?pasword={pw}",
    "a parameter without =": "postgresql://svc@127.0.0.1:{port}/state?password:{pw}",
    "a mistyped scheme": "postgressql://svc:{pw}@127.0.0.1:{port}/state",
}


def form(template: str, secret: str, port: int = 5432) -> str:
    return template.format(pw=secret, port=port)


def kafka(**overrides: Any) -> KafkaStreamGroup:
    fields: dict[str, Any] = {"group": "g", "bootstrap_servers": "127.0.0.1:9092", "topics": ["clicks"]}
    return KafkaStreamGroup(**{**fields, **overrides})


def v3io(**overrides: Any) -> V3ioStreamGroup:
    fields: dict[str, Any] = {"group": "g", "endpoint": "http://127.0.0.1:8081", "container": "c", "stream_path": "s"}
    return V3ioStreamGroup(**{**fields, **overrides})


def refusal(build: Callable[[], object], secret: str, *names: str) -> str:
    """The error of a configuration that must be refused: it names each of ``names`` and no piece of ``secret``."""
    with pytest.raises(CONFIG_ERRORS) as caught:
        build()
    text = str(caught.value)
    for name in names:
        assert name in text, text
    assert not shows_a_piece(text, secret), text
    return text


def load(resources: dict[str, Any]) -> None:
    """What a code location does with its definitions when it loads (``dagster definitions validate``)."""

    @dg.asset(required_resource_keys=set(resources))
    def uses_them() -> None:
        """Only here to make the resources part of the definitions."""

    dg.Definitions.validate_loadable(dg.Definitions(assets=[uses_them], resources=resources))


def snapshot(resources: dict[str, Any]) -> str:
    """What the code location serves the UI (its Resources page) and every run stores with its job snapshot."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    @dg.asset(required_resource_keys=set(resources))
    def uses_them() -> None:
        """Only here to make the resources part of the definitions."""

    repository = dg.Definitions(assets=[uses_them], resources=resources).get_repository_def()
    return serialize_value(RepositorySnap.from_def(repository))


# A store URL from an EnvVar: checked when the definitions load.


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_bad_store_url_from_an_env_var_is_one_error_when_the_definitions_load(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the URL was checked only in each tick, whose error (the DSN and mistyped forms quoted whole) went
    to Dagster's tick history, the daemon's log and the CLI, once per tick."""
    secret = new_secret()
    monkeypatch.setenv("SG_STORE_URL", form(REFUSED[name], secret))
    text = refusal(lambda: kafka(store_url=dg.EnvVar("SG_STORE_URL")), secret, "store_url", "SG_STORE_URL")
    if name == "keyword DSN":
        assert "postgresql://USER:PASSWORD@HOST:PORT/DB" in text, text


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_store_url_from_an_env_var_loads_in_every_accepted_form_and_the_snapshot_keeps_its_name(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    monkeypatch.setenv("SG_STORE_URL", form(ACCEPTED[name], secret))
    resources = {"g": kafka(store_url=dg.EnvVar("SG_STORE_URL"))}
    load(resources)
    shown = snapshot(resources)
    assert "SG_STORE_URL" in shown and not shows_a_piece(shown, secret)


def test_a_store_url_env_var_unset_at_load_is_checked_where_it_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SG_STORE_URL", raising=False)
    resource = kafka(store_url=dg.EnvVar("SG_STORE_URL"))
    secret = new_secret()
    monkeypatch.setenv("SG_STORE_URL", form(REFUSED["keyword DSN"], secret))
    refusal(resource.process_config_and_initialize, secret, "store_url")


# Literal secrets in Python definitions: refused when they load.


LITERALS: dict[str, tuple[Callable[[str], object], str, str]] = {
    # name: (build the resource with the secret, the field, where else it may come from)
    "store_url, user info": (lambda s: kafka(store_url=form(ACCEPTED["user info"], s)), "store_url", "dg.EnvVar"),
    "store_url, password parameter": (
        lambda s: kafka(store_url=form(ACCEPTED["password parameter"], s)),
        "store_url",
        "dg.EnvVar",
    ),
    "store_url, sslpassword parameter": (
        lambda s: v3io(store_url=form(ACCEPTED["sslpassword parameter"], s)),
        "store_url",
        "dg.EnvVar",
    ),
    "sasl_password": (
        lambda s: kafka(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u", sasl_password=s),
        "sasl_password",
        "sasl_password_file",
    ),
    "ssl_key_password": (
        lambda s: kafka(security_protocol="SSL", ssl_key_location="/k.pem", ssl_key_password=s),
        "ssl_key_password",
        "ssl_key_password_file",
    ),
    "oauthbearer_client_secret": (
        lambda s: kafka(
            security_protocol="SASL_SSL",
            sasl_mechanism="OAUTHBEARER",
            oauthbearer_client_id="c",
            oauthbearer_client_secret=s,
            oauthbearer_token_endpoint_url="https://idp.example/token",
        ),
        "oauthbearer_client_secret",
        "oauthbearer_client_secret_file",
    ),
    "access_key": (lambda s: v3io(access_key=s), "access_key", "access_key_file"),
    "Spark Connect token": (
        lambda s: StreamSparkResource(remote=f"sc://127.0.0.1:15002/;token={s}"),
        "remote",
        "dg.EnvVar",
    ),
}


@pytest.mark.parametrize("name", sorted(LITERALS))
def test_a_literal_secret_in_python_definitions_is_refused_when_they_load(name: str) -> None:
    """Dagster keeps a resource's literal values in the code location's snapshot: the UI's Resources page and
    every run's stored job snapshot. A resource built outside definitions (a script, a test) may hold one."""
    build, field, alternative = LITERALS[name]
    secret = new_secret()
    resource = build(secret)  # built: a script may use it directly
    text = refusal(lambda: load({"r": resource}), secret, field, alternative)
    assert "dg.EnvVar" in text, text


def test_the_same_secrets_from_env_vars_load(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = new_secret()
    monkeypatch.setenv("SG_SECRET", secret)
    monkeypatch.setenv("SG_STORE_URL", form(ACCEPTED["password parameter"], secret))
    monkeypatch.setenv("SG_REMOTE", f"sc://127.0.0.1:15002/;token={secret}")
    resources = {
        "kafka": kafka(
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="u",
            sasl_password=dg.EnvVar("SG_SECRET"),
            store_url=dg.EnvVar("SG_STORE_URL"),
        ),
        "v3io": v3io(access_key=dg.EnvVar("SG_SECRET")),
        "spark": StreamSparkResource(remote=dg.EnvVar("SG_REMOTE")),
    }
    load(resources)
    assert not shows_a_piece(snapshot(resources), secret)


# What a store says of its URL.


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_store_url_is_never_quoted(name: str) -> None:
    secret = new_secret()
    for call in (check_store_url, open_store):
        text = refusal(lambda call=call: call(form(REFUSED[name], secret), field="state_url"), secret, "state_url")
    assert "not a" in text or "cannot" in text or "refused" in text or "well-formed" in text, text


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_store_that_cannot_be_reached_says_so_without_the_secret(name: str) -> None:
    """libpq's refusal (nothing listens on the port) as the store reports it, for each form of the password."""
    pytest.importorskip("psycopg")
    secret = new_secret()
    with pytest.raises(StoreUnavailableError) as caught:
        open_store(form(ACCEPTED[name], secret, port=free_port()))
    text = str(caught.value)
    assert MASK in text and "127.0.0.1" in text, text
    assert not shows_a_piece(text, secret), text
    # The driver's own error is not chained: Dagster would show it as the cause, unscrubbed.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@settings(max_examples=300, deadline=None)
@given(st.one_of(postgres_urls(), mistyped_urls(), keyword_dsns()))
def test_checking_any_generated_store_url_shows_no_piece_of_its_secret(case: tuple[str, str]) -> None:
    text, _secret = case
    try:
        check_store_url(text)
    except StoreConfigError as exc:
        message = str(exc)
        for fixed in (*SUPPORTED, "SCHEME://", "USER:PASSWORD@HOST:PORT/DB", "SQLAlchemy", "URL", "DSN"):
            message = message.replace(fixed, "")
        assert not leaked(message), (text, str(exc))
