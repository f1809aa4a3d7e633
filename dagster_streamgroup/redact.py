"""What may be shown of a connection string or a credential: one redaction for every message, error, log line,
metadata value, tag and CLI output that mentions one.

A user writes a database's credentials in many forms: in a URL's user info (``postgresql://u:PW@h/db``), in its
query (``?password=PW``, ``?sslpassword=PW``: libpq reads them there too), as a libpq keyword DSN
(``host=h password=PW``), or mistyped (``postgresql:/u:PW@h/db``, an unencoded ``@`` or ``/`` in the password). A
redaction that knows one form prints the others whole. So strings are read here with the parsers of the drivers
that will read them (SQLAlchemy's ``make_url`` and libpq's own, through psycopg's ``conninfo_to_dict``), and
only what those parsers agree on is shown, each secret part replaced by ``***``. A string they do not read alike,
or do not read at all, shows nothing but its scheme (``postgresql://***``) or a fixed placeholder: a typo may put
a password anywhere, and there is no telling which part it is.

``redact(text)`` is the shown form; ``secrets_in(text)`` the secret values, to ``scrub`` from a driver's messages
(they may quote a value the driver read); ``holds_secret(text)`` says a literal must not be configured (Dagster
keeps a resource's literal values in the code location's snapshot). Other credentials go through the same
functions: a Schema Registry's ``basic.auth.user.info`` (``redact_user_info``), a bearer token or any secret
value (``scrub``), a sink's JDBC or object-store URL (``redact``, ``jdbc:`` prefixes included).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

MASK = "***"
"""What stands for a secret value."""

PLACEHOLDER = "<hidden: not a URL or DSN this can read>"
"""What stands for a whole string that neither is a URL with a scheme nor parses as a keyword DSN."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_BARE_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_HOST = re.compile(r"^[A-Za-z0-9._~\-]+$|^[0-9A-Fa-f:.]+$")
"""A host name, an IPv4 address, or an IPv6 address as SQLAlchemy and urllib give it (without brackets)."""
SHOWN_PARAMETERS = frozenset(
    {
        # v3io store URLs; Spark Connect's sc:// parameters but its token; SQLAlchemy's SQLite options.
        "https", "compress", "access_key_file",
        "user_id", "user_agent", "use_ssl", "grpc_max_message_size",
        "timeout", "uri", "check_same_thread", "cached_statements", "isolation_level", "detect_types", "mode",
        "cache", "immutable", "nolock", "vfs", "modules",
    }
)  # fmt: skip
"""The parameters whose values a URL with no driver to ask (v3io, Spark Connect, SQLite, an HTTP service) shows;
every other value is hidden and counted a secret: a misspelt ``pasword`` is as secret as ``password``."""
_KNOWN_SCHEMES = frozenset(
    {"postgresql", "postgres", "sqlite", "memory", "v3io", "sc", "http", "https", "jdbc", "s3", "s3a", "abfss", "gs"}
)
"""Schemes shown even when what follows them is unreadable (``postgresql:/u:pw@h``, a slash short)."""

# libpq's connection parameters: those it marks secret (dispchar "*") and those it keeps out of displays
# (dispchar "D": debug options, and the SCRAM keys, which log in as the password does). Read from the libpq
# psycopg loads when it is installed; this list is the fallback, and a test keeps it equal to libpq's.
LIBPQ_SECRET_KEYS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
LIBPQ_KEYS = frozenset(
    {
        "service", "user", "password", "passfile", "channel_binding", "connect_timeout", "dbname", "host",
        "hostaddr", "port", "client_encoding", "options", "application_name", "fallback_application_name",
        "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout", "sslmode",
        "sslnegotiation", "sslcompression", "sslcert", "sslkey", "sslcertmode", "sslpassword", "sslrootcert",
        "sslcrl", "sslcrldir", "sslsni", "requirepeer", "require_auth", "min_protocol_version",
        "max_protocol_version", "ssl_min_protocol_version", "ssl_max_protocol_version", "gssencmode",
        "krbsrvname", "gsslib", "gssdelegation", "replication", "target_session_attrs", "load_balance_hosts",
        "scram_client_key", "scram_server_key", "oauth_issuer", "oauth_client_id", "oauth_client_secret",
        "oauth_scope", "sslkeylogfile",
    }
)  # fmt: skip


@cache
def libpq_keys() -> tuple[frozenset[str], frozenset[str]]:
    """(every connection parameter, the secret ones) of the libpq psycopg loads, else of the lists above."""
    try:
        from psycopg import pq
    except ImportError:
        return LIBPQ_KEYS, LIBPQ_SECRET_KEYS
    options = pq.Conninfo.get_defaults()
    keys = frozenset(o.keyword.decode() for o in options)
    secret = frozenset(o.keyword.decode() for o in options if o.dispchar == b"*")
    return keys | LIBPQ_KEYS, secret | LIBPQ_SECRET_KEYS


@dataclass(frozen=True)
class Reading:
    """A connection string as its drivers read it: what may be shown, and the secret values it holds."""

    shown: str
    secrets: tuple[str, ...]
    well_formed: bool
    """Whether the drivers read it alike and completely; if not, ``shown`` is the scheme or the placeholder, and
    ``secrets`` every part of it that could be one."""


def read(text: str) -> Reading:
    """How ``text`` (a URL of any scheme, a ``jdbc:`` URL, a libpq keyword DSN) is shown and what it hides."""
    if text.lower().startswith("jdbc:"):
        inner = read(text[5:])
        return Reading("jdbc:" + inner.shown, inner.secrets, inner.well_formed)
    match = _SCHEME.match(text)
    if match is not None:
        scheme = match.group(1)
        family = scheme.lower().split("+", 1)[0]
        if family in {"postgresql", "postgres"}:
            return _read_postgres_url(text, scheme)
        if family == "sqlite":
            return _read_sqlite_url(text, scheme)
        return _read_url(text, scheme)
    bare = _BARE_SCHEME.match(text)
    if bare is not None and bare.group(1).lower() in _KNOWN_SCHEMES:
        return _unreadable(text, f"{bare.group(1)}:{MASK}")
    if "=" in text:
        return _read_keyword_dsn(text)
    return _unreadable(text, PLACEHOLDER if text else "")


def redact(text: str) -> str:
    """``text`` as it may be shown: each secret part replaced by ``***``; a string its drivers would not read
    alike shows only its scheme (``postgresql://***``), and one with no scheme that is no DSN a placeholder."""
    return read(text).shown


def secrets_in(text: str) -> tuple[str, ...]:
    """The secret values ``text`` holds as its drivers read them (every part of it, if they would not read it
    alike), longest first: what ``scrub`` removes from a message about it."""
    return read(text).secrets


def holds_secret(text: str) -> bool:
    """Whether ``text`` holds a password, key or token, or cannot be read well enough to tell it does not."""
    reading = read(text)
    return bool(reading.secrets) or not reading.well_formed


def redact_user_info(user_info: str) -> str:
    """``USER:PASSWORD`` (HTTP basic auth, a Schema Registry's ``basic.auth.user.info``) as ``USER:***``; a value
    without a colon is all secret (a token given as the user)."""
    user, colon, _secret = user_info.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def scrub(message: str, secrets: Iterable[str]) -> str:
    """``message`` with every secret replaced by ``***``: as written, URL-quoted, and escaped as JSON and Python
    reprs write it (a driver's message may quote a value in any of these)."""
    forms: set[str] = set()
    for secret in secrets:
        if secret:
            escaped = secret.replace("\\", "\\\\")
            forms |= {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1], repr(secret)[1:-1]}
            forms |= {escaped.replace("'", "\\'"), escaped.replace('"', '\\"')}
    for form in sorted(forms, key=len, reverse=True):
        message = message.replace(form, MASK)
    return message


# The forms.


_DELIMITERS = re.compile(r"""[:/@?#&=;,\s'"\\]+""")
"""What separates the parts of a URL or DSN, and the quotes and escapes around its values."""


def _unreadable(text: str, shown: str) -> Reading:
    """Nothing is known of ``text``'s parts: every piece of it could be the secret."""
    pieces = {text, *(p for p in _DELIMITERS.split(text) if p)}
    decoded = {p for piece in pieces for p in (unquote(piece), unquote_plus(piece))}
    decoded |= {p for d in decoded for p in _DELIMITERS.split(d) if p}
    return Reading(shown, _longest_first(pieces | decoded), well_formed=False)


def _longest_first(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({v for v in values if v}, key=len, reverse=True))


def _query_shown(
    pairs: Iterable[tuple[str, str]], is_secret: Callable[[str], bool], known: Callable[[str], object]
) -> str:
    """A query string with each secret value masked and each parameter of an unknown name hidden whole (a name
    that is a typo may hold the password: ``?password:PW``)."""
    shown: list[str] = []
    hidden = False
    for key, value in pairs:
        if not known(key):
            hidden = True
        elif is_secret(key):
            shown.append(f"{quote(key, safe='')}={MASK}")
        else:
            shown.append(f"{quote(key, safe='')}={quote(value, safe='/:,')}")
    if hidden:
        shown.append(MASK)
    return "&".join(shown)


def _read_postgres_url(text: str, scheme: str) -> Reading:
    """A PostgreSQL URL, read by SQLAlchemy (what the store connects with) and by libpq (what psycopg connects
    with): shown only where both read the same user, password, host, port and database, and its host is a host."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    scheme_only = f"{scheme}://{MASK}"
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        return _unreadable(text, scheme_only)
    keys, secret_keys = libpq_keys()
    query = [(k, v) for k, values in url.query.items() for v in ((values,) if isinstance(values, str) else values)]
    if any(k not in keys for k, _ in query) or (url.host is not None and not _HOST.match(url.host)):
        return _unreadable(text, scheme_only)
    if any("=" not in p for p in text.partition("?")[2].split("&") if p):
        return _unreadable(text, scheme_only)  # a parameter SQLAlchemy drops (libpq refuses it): a typo
    if text.count("@") > (0 if url.username is None and url.password is None else 1):
        return _unreadable(text, scheme_only)  # an @ of a password that ended up in the database name
    if not _authority_agrees(text, url.username, url.password, url.host, url.port):
        return _unreadable(text, scheme_only)  # an unencoded / or ? in the password: the parsers split it apart
    effective = {"user": url.username or "", "password": url.password or "", "host": url.host or ""}
    effective |= {"port": "" if url.port is None else str(url.port), "dbname": url.database or ""}
    effective |= dict(query)
    asked, libpq = _libpq_reading(f"postgresql://{text.split('://', 1)[1]}")
    if asked and (libpq is None or any(libpq.get(k, "") != v for k, v in effective.items())):
        return _unreadable(text, scheme_only)
    secrets = [str(url.password or "")] + [v for k, v in query if k in secret_keys]
    base = url.set(query={}, password=MASK if url.password else None).render_as_string(hide_password=True)
    query_text = _query_shown(query, lambda k: k in secret_keys, lambda k: True)
    return Reading(base + (f"?{query_text}" if query_text else ""), _longest_first(secrets), well_formed=True)


def _authority_agrees(text: str, user: str | None, password: str | None, host: str | None, port: int | None) -> bool:
    """Whether RFC 3986 (urllib) reads the user, password, host and port SQLAlchemy read. SQLAlchemy takes all up
    to the last ``@`` as user info, so ``//u:p/w@h`` gives it the password ``p/w`` and the host ``h``, where
    urllib and libpq see the host ``u`` and a path; without libpq installed to ask, this is the check that the
    parts are where they seem."""
    try:
        parts = urlsplit(text)
        theirs = (parts.username, parts.password, parts.hostname, parts.port)
    except ValueError:
        return False
    unquoted = tuple(None if v is None else unquote(v) for v in theirs[:2])
    return unquoted == (user, password) and (theirs[2] or None) == (host or None) and theirs[3] == port


def _libpq_reading(uri: str) -> tuple[bool, dict[str, str] | None]:
    """Whether libpq could be asked (psycopg is installed), and what it reads from ``uri`` (``None``: it does
    not read it, as a query parameter it does not know or a port that is no number)."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return False, None
    try:
        return True, {k: str(v) for k, v in conninfo_to_dict(uri).items()}
    except ProgrammingError:
        return True, None


def _read_sqlite_url(text: str, scheme: str) -> Reading:
    """``sqlite:///PATH``: a path and driver options, no credentials; anything in its user-info place is not."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        return _unreadable(text, f"{scheme}://{MASK}")
    if url.username or url.password or url.host or url.port:
        return _unreadable(text, f"{scheme}://{MASK}")
    query = [(k, v) for k, values in url.query.items() for v in ((values,) if isinstance(values, str) else values)]
    secrets = [v for k, v in query if _hidden(k)] + [k for k, _ in query if not _named(k)]
    base = url.set(query={}).render_as_string(hide_password=True)
    query_text = _query_shown(query, _hidden, _named)
    return Reading(base + (f"?{query_text}" if query_text else ""), _longest_first(secrets), well_formed=True)


SECRET_PARAMETERS = frozenset(
    {"password", "passwd", "pwd", "token", "access_key", "secret", "api_key", "apikey", "auth", "key", "sig"}
    | LIBPQ_SECRET_KEYS
)
"""Parameters whose names are shown with their values hidden; a parameter of neither list is hidden whole (its
name may be a piece of a password that held a ``;`` or ``&``)."""


def _hidden(key: str) -> bool:
    return key not in SHOWN_PARAMETERS


def _named(key: str) -> bool:
    return key in SHOWN_PARAMETERS or key in SECRET_PARAMETERS


def _read_url(text: str, scheme: str) -> Reading:
    """Any other URL (v3io, Spark Connect's ``sc://``, HTTP services, object stores), read as RFC 3986 has it
    (urllib): its user info hidden (a token given as the user may hold a colon, so the user name too), and every
    parameter's value but those of ``SHOWN_PARAMETERS``; ``;key=value`` parameters (Spark
    Connect's ``sc://host/;token=...``) as query parameters. An ``@`` outside the authority, a second one in it,
    a ``#`` or a port that is no number means the parts are not where they seem: then only the scheme is shown."""
    scheme_only = f"{scheme}://{MASK}"
    try:
        parts = urlsplit(text)
        port, hostname = parts.port, parts.hostname
    except ValueError:  # a port that is no number, brackets that hold no IPv6 address
        return _unreadable(text, scheme_only)
    if "@" in parts.path + parts.query or parts.netloc.count("@") > 1 or (hostname and not _HOST.match(hostname)):
        return _unreadable(text, scheme_only)
    if "#" in text:  # a connection has no fragment: this is a character of a password or token, not encoded
        return _unreadable(text, scheme_only)
    secrets: list[str] = []
    user_info = ""
    if "@" in parts.netloc:  # all of it: a token given as the user may hold a colon
        raw = parts.netloc.rpartition("@")[0]
        secrets += [raw, unquote(raw), *(p for piece in raw.split(":") for p in (piece, unquote(piece)))]
        user_info = f"{MASK}@"
    host = hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{user_info}{host}{'' if port is None else f':{port}'}"
    path, semi, params = parts.path.partition(";")
    raw_params = [_raw_pair(p) for p in params.split(";") if p] if semi else []
    raw_query = [_raw_pair(p) for p in parts.query.split("&") if p]
    for key, value in [*raw_params, *raw_query]:
        if _hidden(unquote_plus(key)):
            secrets += [value, unquote(value), unquote_plus(value)]
        if not _named(unquote_plus(key)):
            secrets += [key, unquote(key), unquote_plus(key)]
    path_pairs = [(unquote_plus(k), unquote_plus(v)) for k, v in raw_params]
    query_pairs = [(unquote_plus(k), unquote_plus(v)) for k, v in raw_query]
    shown_params = _query_shown(path_pairs, _hidden, _named).replace("&", ";") if semi else ""
    shown_query = _query_shown(query_pairs, _hidden, _named)
    shown = f"{scheme}://{netloc}{path}{';' + shown_params if semi else ''}{'?' + shown_query if shown_query else ''}"
    return Reading(shown, _longest_first(secrets), well_formed=True)


def _raw_pair(parameter: str) -> tuple[str, str]:
    key, _, value = parameter.partition("=")
    return key, value


def _read_keyword_dsn(text: str) -> Reading:
    """A libpq keyword DSN (``host=h dbname=d password=PW``), read by libpq; shown with libpq's own quoting."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
    except ImportError:
        return _unreadable(text, PLACEHOLDER)
    try:
        values = {k: str(v) for k, v in conninfo_to_dict(text).items()}
    except ProgrammingError:
        return _unreadable(text, PLACEHOLDER)
    _keys, secret_keys = libpq_keys()
    secrets = [v for k, v in values.items() if k in secret_keys]
    shown = make_conninfo("", **{k: MASK if k in secret_keys else v for k, v in values.items()})
    return Reading(shown, _longest_first(secrets), well_formed=True)
