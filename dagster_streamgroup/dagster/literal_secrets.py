"""Secrets given as literals in Python definitions, refused when the definitions load.

Dagster keeps a resource's configured values in the code location's snapshot: the UI's Resources page shows them
and every run stores them with its job snapshot. A ``dagster.EnvVar`` is kept as its variable's name, a literal
as itself. So a secret field given a literal, or a connection string holding a password or token, is refused
when the resource becomes part of definitions (``get_resource_definition``, which Dagster calls as the code
location loads, and ``materialize`` and the test helpers call too), not when it is built: a script may build a
resource with a secret it read itself and use it directly, and Dagster builds one with the resolved values in
every tick and run.

The YAML component refuses the same literals earlier, with their file and line (``component.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

from dagster_streamgroup.redact import read

KEEP_NOTE = (
    "Dagster keeps a resource's literal values in the code location's snapshot, which the UI's Resources page "
    "shows and every run stores"
)


class LiteralSecretError(ValueError):
    """A secret is a literal in definitions; the message names the field and never quotes the value."""


def literal_secret_problems(
    resource: Any,
    secret_fields: Mapping[str, str | None],
    connection_strings: Iterable[str] = (),
    keywords: Iterable[str] = (),
) -> list[str]:
    """What is wrong with ``resource``'s secrets: each of ``secret_fields`` (name -> its ``*_file`` alternative)
    given a literal, each of ``connection_strings`` a literal that holds a secret or cannot be read well enough to
    tell it does not (but ``keywords``, words that are not URLs, as ``store_url="v3io"``)."""
    keywords = frozenset(keywords)
    problems = []
    for name, alternative in secret_fields.items():
        value = getattr(resource, name, None)
        if isinstance(value, str) and value and not isinstance(value, dg.EnvVar):
            other = f" or {alternative} (a mounted file)" if alternative else ""
            problems.append(f'{name}: a secret given as a literal; give it as dg.EnvVar("NAME"){other}')
    for name in connection_strings:
        value = getattr(resource, name, None)
        if not isinstance(value, str) or isinstance(value, dg.EnvVar) or value in keywords:
            continue
        reading = read(value)
        if reading.secrets:
            what = "holds a secret" if reading.well_formed else "cannot be read well enough to tell it holds no secret"
            problems.append(f'{name}: {reading.shown} {what}; give the whole URL as dg.EnvVar("NAME")')
    return problems


def refuse_literal_secrets(
    resource: Any,
    secret_fields: Mapping[str, str | None],
    connection_strings: Iterable[str] = (),
    keywords: Iterable[str] = (),
) -> None:
    problems = literal_secret_problems(resource, secret_fields, connection_strings, tuple(keywords))
    if problems:
        raise LiteralSecretError(f"{type(resource).__name__}: {'; '.join(problems)} ({KEEP_NOTE}).")
