"""The redaction of connection strings (``dagster_streamgroup/redact.py``), over generated URLs and DSNs with a
secret in every place a user puts one: a URL's user info (encoded or not, with the characters that cut a URL),
its query (``password``, ``sslpassword``, every parameter libpq calls secret, and their misspellings), a keyword
DSN, a scheme a slash short, Spark Connect's ``;token=``, an HTTP service's user info, a JDBC URL.

Every secret is drawn from letters that no other part of a generated string uses (upper-case N-Z) and
punctuation, so any piece of it that is shown, as written or percent-encoded, is found by its letters."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dagster_streamgroup.redact import (
    LIBPQ_KEYS,
    LIBPQ_SECRET_KEYS,
    MASK,
    PLACEHOLDER,
    holds_secret,
    libpq_keys,
    read,
    redact,
    redact_user_info,
    scrub,
    secrets_in,
)

MARKS = "NOPQRSTUVWXYZ"
"""The secret's letters: nothing else in a generated string has them (hex digits are A-F)."""
PUNCTUATION = "@/?#:;&=%+ !$'\"\\,[]{}~`^|<>"

secret_values = st.text(alphabet=MARKS + PUNCTUATION, min_size=6, max_size=24).filter(
    lambda s: sum(c in MARKS for c in s) >= 4
)
names = st.text(alphabet="abcdefghijklm", min_size=1, max_size=8)
hosts = st.one_of(names, st.builds(lambda a, b: f"{a}.{b}", names, names), st.just("127.0.0.1"), st.just("[::1]"))
ports = st.one_of(st.none(), st.integers(1, 65535))
safe_params = st.lists(
    st.sampled_from(["sslmode=require", "connect_timeout=10", "application_name=app", "sslmode=disable"]),
    max_size=2,
)
postgres_schemes = st.sampled_from(["postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"])
secret_keys = st.sampled_from(sorted(LIBPQ_SECRET_KEYS))
misspelt_keys = st.sampled_from(["pasword", "passwd", "Password", "pass", "pwd", "ssl_password", "sslpasword"])


def leaked(shown: str) -> bool:
    return any(c in MARKS for c in shown.replace(PLACEHOLDER, ""))


def encodings(secret: str) -> list[str]:
    """The secret as a URL may hold it: as written (unencoded, the cutting characters included) and encoded."""
    return [secret, quote(secret, safe=""), quote(secret, safe="!$'*+,;=")]


def _authority(host: str, port: int | None) -> str:
    return host + ("" if port is None else f":{port}")


@st.composite
def postgres_urls(draw: st.DrawFn, encoded: bool = False) -> tuple[str, str]:
    """A PostgreSQL URL with a secret in its user info, in a secret parameter or in a misspelt one."""
    secret = draw(secret_values)
    scheme, user, host, port, db = draw(postgres_schemes), draw(names), draw(hosts), draw(ports), draw(names)
    params = draw(safe_params)
    written = quote(secret, safe="") if encoded else draw(st.sampled_from(encodings(secret)))
    where = draw(st.sampled_from(["user info", "parameter", "misspelt parameter", "parameter without ="]))
    if where == "user info":
        url = f"{scheme}://{user}:{written}@{_authority(host, port)}/{db}"
    elif where == "parameter":
        params = [*params, f"{draw(secret_keys)}={written}"]
        url = f"{scheme}://{user}@{_authority(host, port)}/{db}"
    elif where == "misspelt parameter":
        params = [*params, f"{draw(misspelt_keys)}={written}"]
        url = f"{scheme}://{user}@{_authority(host, port)}/{db}"
    else:
        params = [*params, f"password:{written}"]
        url = f"{scheme}://{user}@{_authority(host, port)}/{db}"
    params = draw(st.permutations(params))
    return (url + ("?" + "&".join(params) if params else "")), secret


@st.composite
def mistyped_urls(draw: st.DrawFn) -> tuple[str, str]:
    """A PostgreSQL URL mistyped: a slash short or long, a colon missing, a port that is no number."""
    secret = draw(secret_values)
    user, host, db = draw(names), draw(hosts), draw(names)
    written = draw(st.sampled_from(encodings(secret)))
    prefix = draw(st.sampled_from(["postgresql:/", "postgresql:", "postgresql//", "postgresql:///", "postgres:/"]))
    form = draw(st.sampled_from(["typo", "bad port", "host with @"]))
    if form == "typo":
        return f"{prefix}{user}:{written}@{host}/{db}", secret
    if form == "bad port":
        return f"postgresql://{user}:{written}@{host}:{draw(names)}/{db}", secret
    return f"postgresql://{user}:{draw(names)}@{written}@{host}/{db}", secret


def dsn_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@st.composite
def keyword_dsns(draw: st.DrawFn, encoded: bool = False) -> tuple[str, str]:
    """A libpq keyword DSN with a secret parameter (quoted as libpq wants, or not), or a misspelt one."""
    secret = draw(secret_values)
    key = draw(st.one_of(secret_keys, misspelt_keys))
    value = dsn_quote(secret) if encoded else draw(st.sampled_from([dsn_quote(secret), secret]))
    parts = [f"host={draw(names)}", f"dbname={draw(names)}", f"user={draw(names)}", f"{key}={value}"]
    parts = draw(st.permutations(parts))
    return " ".join(parts), secret


@st.composite
def other_urls(draw: st.DrawFn, encoded: bool = False) -> tuple[str, str]:
    """The other connection strings: an HTTP service's user info (a password, or a token given as the user),
    Spark Connect's token, a v3io URL with the key where it must not be, a JDBC URL."""
    secret = draw(secret_values)
    host, port, path = draw(hosts), draw(ports), draw(names)
    written = quote(secret, safe="") if encoded else draw(st.sampled_from(encodings(secret)))
    return draw(
        st.sampled_from(
            [
                f"https://{draw(names)}:{written}@{_authority(host, port)}/{path}",
                f"https://{written}@{_authority(host, port)}",
                f"sc://{_authority(host, port)}/;user_id={draw(names)};token={written}",
                f"v3io://{_authority(host, port)}/bigdata?access_key={written}",
                f"v3io://{written}@{_authority(host, port)}/bigdata",
                f"jdbc:postgresql://{_authority(host, port)}/{path}?user={draw(names)}&password={written}",
                f"http://{_authority(host, port)}/{path}?token={written}&https=true",
            ]
        )
    ), secret


every_form = st.one_of(postgres_urls(), mistyped_urls(), keyword_dsns(), other_urls())
encoded_forms = st.one_of(postgres_urls(encoded=True), keyword_dsns(encoded=True), other_urls(encoded=True))
"""The forms with the secret encoded as its driver decodes it: what a driver's message would quote is the secret."""


@contextmanager
def psycopg_absent() -> Iterator[None]:
    """The package's runtime install has no psycopg (it comes with the ``postgres`` extra): its import fails as
    a missing module's does, so the redaction reads without libpq to ask."""
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "psycopg"}
    for name in saved:
        del sys.modules[name]
    sys.modules["psycopg"] = None  # type: ignore[assignment]
    libpq_keys.cache_clear()
    try:
        yield
    finally:
        del sys.modules["psycopg"]
        sys.modules.update(saved)
        libpq_keys.cache_clear()


UNENCODED_SLASH_IN_PASSWORD = ("jdbc:postgresql://a:1/a?user=a&password=:@NNNN", ":@NNNN")
"""SQLAlchemy reads all up to the last ``@`` as user info (the host ``NNNN``), urllib and libpq the host ``a``."""


@settings(max_examples=600, deadline=None)
@given(every_form)
@example(UNENCODED_SLASH_IN_PASSWORD)
def test_no_piece_of_a_secret_is_shown_in_any_form(case: tuple[str, str]) -> None:
    text, _secret = case
    shown = redact(text)
    assert not leaked(shown), (text, shown)
    assert holds_secret(text), text  # a literal of any of these is refused at load


@settings(max_examples=600, deadline=None)
@given(every_form)
@example(UNENCODED_SLASH_IN_PASSWORD)
def test_no_piece_of_a_secret_is_shown_without_libpq(case: tuple[str, str]) -> None:
    text, _secret = case
    with psycopg_absent():
        shown, holds = redact(text), holds_secret(text)
    assert not leaked(shown), (text, shown)
    assert holds, text


@settings(max_examples=300, deadline=None)
@given(st.one_of(every_form, encoded_forms))
def test_a_drivers_message_quoting_the_secret_is_scrubbed(case: tuple[str, str]) -> None:
    """A driver's error may quote a value it read (as written, or escaped as JSON or a repr would). Where the
    string cannot be read alike by its drivers, every piece of it counts as a secret."""
    text, secret = case
    reading = read(text)
    assert reading.secrets and secrets_in(text) == reading.secrets, text
    for message in (f'bad value "{secret}" for password', json.dumps({"detail": secret}), repr(("x", secret))):
        if not reading.well_formed or secret in reading.secrets:
            assert not leaked(scrub(message, reading.secrets)), (text, message)


@settings(max_examples=300, deadline=None)
@given(postgres_urls())
def test_a_well_formed_url_keeps_what_is_not_secret(case: tuple[str, str]) -> None:
    text, _secret = case
    reading = read(text)
    if reading.well_formed:
        assert reading.shown.split("://", 1)[0] == text.split("://", 1)[0]
        assert "@" in reading.shown or "?" in reading.shown
        assert MASK in reading.shown


@settings(max_examples=200, deadline=None)
@given(postgres_schemes, names, hosts, ports, names, safe_params)
def test_a_url_without_a_secret_is_shown_as_written(
    scheme: str, user: str, host: str, port: int | None, db: str, params: list[str]
) -> None:
    text = f"{scheme}://{user}@{_authority(host, port)}/{db}" + ("?" + "&".join(params) if params else "")
    reading = read(text)
    assert reading.well_formed and not holds_secret(text)
    assert reading.shown == text


def test_what_each_form_shows() -> None:
    """The forms of the docs (docs/stores.md), as a user sees them."""
    assert redact("postgresql://u:pw@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert (
        redact("postgresql://u@db/x?password=pw&sslmode=require") == "postgresql://u@db/x?password=***&sslmode=require"
    )
    assert redact("postgresql://u:pw@db/x?sslpassword=pw2") == "postgresql://u:***@db/x?sslpassword=***"
    assert redact("postgresql://u:p%40ss@db/x") == "postgresql://u:***@db/x"
    assert redact("postgresql://u:p@ss@db:5432/x") == "postgresql://***"  # an unencoded @: which part is which?
    assert redact("postgresql:/u:pw@db/x") == "postgresql:***"
    assert redact("postgresql://u@db/x?pasword=pw") == "postgresql://***"  # libpq knows no such parameter
    assert redact("sqlite:////var/state.db") == "sqlite:////var/state.db"
    assert redact("v3io://h:8081/bigdata?access_key_file=/run/key") == "v3io://h:8081/bigdata?access_key_file=/run/key"
    assert redact("sc://h:15002/;token=t;user_id=me") == "sc://h:15002/;token=***;user_id=me"
    assert redact("https://svc:pw@registry:8081") == "https://***@registry:8081"
    assert redact("jdbc:postgresql://h/x?user=u&password=pw") == "jdbc:postgresql://h/x?user=u&password=***"
    assert redact_user_info("svc:pw") == "svc:***" and redact_user_info("token") == "***"


def test_what_libpq_reads_differently_or_not_at_all_shows_only_the_scheme() -> None:
    """Where psycopg is installed, libpq's own parser reads every PostgreSQL URL and keyword DSN too."""
    pytest.importorskip("psycopg")
    assert redact("postgresql://u:pa/ss@db/x") == "postgresql://***"  # libpq: host u, port pa; SQLAlchemy: db
    assert redact("host=db dbname=x password=pw") == "password=*** dbname=x host=db"
    assert redact("host=db pasword=pw") == PLACEHOLDER


def test_scrub_replaces_every_form_a_message_may_quote() -> None:
    secret = 'pa"ss wo/rd'
    message = f"a {secret} b {quote(secret, safe='')} c {json.dumps(secret)} d {secret!r}"
    assert scrub(message, [secret]).count(MASK) == 4
    assert "pa" not in scrub(message, [secret])
    assert scrub("nothing here", []) == "nothing here"


def test_the_fallback_lists_match_the_installed_libpq() -> None:
    """Without psycopg the lists stand in for libpq's own; a libpq that adds a secret parameter fails here."""
    pq = pytest.importorskip("psycopg.pq")
    options = pq.Conninfo.get_defaults()
    keys = {o.keyword.decode() for o in options}
    secret = {o.keyword.decode() for o in options if o.dispchar == b"*"}
    assert keys <= LIBPQ_KEYS, sorted(keys - LIBPQ_KEYS)
    assert secret <= LIBPQ_SECRET_KEYS, sorted(secret - LIBPQ_SECRET_KEYS)
    assert libpq_keys()[1] >= secret
