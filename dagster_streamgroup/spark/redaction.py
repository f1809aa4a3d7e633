"""What Spark shows of a secret passed as a data source option: redacted by the string pattern we set.

Our sources take their credentials as options (``kafka.sasl.password``, ``v3io.access.key``), and Spark puts a
plan's text where operators look: a Spark Connect server shows each statement's plan, options and values
included, in its UI's Connect tab, in the job and stage descriptions (the UI and its REST API) and in the event
log. Spark redacts option values by key in the plans it renders itself (``spark.redaction.regex``), but those
texts only through ``spark.sql.redaction.string.regex``, which is unset by default. So every session and server
the product starts sets it (a user's own setting wins) to a pattern that matches a secret option and its value
in each form the texts take: Spark Connect's plan text (``key: "kafka.sasl.password"`` then ``value: "..."``),
Scala maps (``kafka.sasl.password -> ...``), JSON and ``key=value``.
"""

from __future__ import annotations

import re

from dagster_streamgroup.streams.kafka_config import SECRET_PROPERTIES, SECRET_SUFFIXES

STRING_REDACTION_KEY = "spark.sql.redaction.string.regex"
V3IO_ACCESS_KEY_OPTION = "v3io.access.key"
REGISTRY_SECRET_OPTIONS = frozenset({"registry.basic.auth.secret", "registry.bearer.auth.token"})
"""The Schema Registry's credentials as our sources take them (``formats.config.SECRET_OPTION_NAMES``)."""

_SECRET_OPTIONS = SECRET_PROPERTIES | REGISTRY_SECRET_OPTIONS | {V3IO_ACCESS_KEY_OPTION}
_NAMES = "|".join(
    [
        *(re.escape(name) for name in sorted(_SECRET_OPTIONS, key=len, reverse=True)),
        *(rf"[\w.-]*{re.escape(suffix)}" for suffix in SECRET_SUFFIXES),
        r"access[._-]?key",
    ]
)
SECRET_REDACTION_REGEX = (
    rf"(?i)(?:{_NAMES})\"?\s*(?:->|=|:|\"?\s*value:)?\s*"
    r"(?:\"(?:[^\"\\]|\\.)*\"|[^,)}\s\"][^,)}\n]*)"
)
"""A secret option's name and its value (quoted, or up to the next ``,`` ``)`` ``}`` or line end); Java's and
Python's regex syntax agree on every construct used, so tests check it with ``re``."""


def with_string_redaction(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with ``SECRET_REDACTION_REGEX`` as the string redaction, unless the caller set their own."""
    return conf if conf.get(STRING_REDACTION_KEY) else {**conf, STRING_REDACTION_KEY: SECRET_REDACTION_REGEX}
