"""Searching evidence for secrets: every place a deployment could write one, as text or bytes, against each
secret as written and in the encodings a careless log line or a client library might use (hex, base64 at any
alignment, standard and URL-safe, URL-quoted, JSON-escaped)."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, quote_plus


@dataclass(frozen=True)
class Finding:
    where: str
    """What held it: a file path, or a named piece of evidence (``graphql: run tags``, ``cli: status stderr``)."""
    secret: str
    """The secret's name (never its value)."""
    encoding: str


@dataclass
class Evidence:
    """Named texts and files to search; ``summary()`` says how much was searched."""

    texts: dict[str, bytes]
    files: list[Path]

    def __init__(self) -> None:
        self.texts = {}
        self.files = []

    def add(self, where: str, text: str | bytes) -> None:
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        self.texts[where] = self.texts.get(where, b"") + data + b"\n"

    def add_tree(self, root: Path) -> None:
        """Every regular file under ``root`` (or ``root`` itself), read when searched."""
        if root.is_file():
            self.files.append(root)
        elif root.is_dir():
            for directory, _dirs, names in os.walk(root):
                self.files.extend(Path(directory) / name for name in names)

    def summary(self) -> str:
        total = sum(len(t) for t in self.texts.values()) + sum(_size(p) for p in self.files)
        return f"{len(self.texts)} named texts and {len(self.files)} files, {total / 1e6:.1f} MB"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _base64_cores(raw: bytes) -> dict[str, bytes]:
    """The part of each base64 encoding of ``raw`` that depends on ``raw`` alone, whatever precedes or
    follows it in the encoded stream (one per alignment of ``raw`` in 3-byte groups)."""
    out = {}
    for shift in range(3):
        first = -(-shift * 8 // 6)  # the first character made of the secret's bits only
        last = (shift + len(raw)) * 8 // 6  # characters beyond it also hold bits of what follows
        for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            core = encode(b"\0" * shift + raw)[first:last]
            out[f"{name}@{shift}"] = core
    return out


def needles(secret: str) -> dict[str, bytes]:
    r"""The byte strings that betray ``secret``: as written, hex, base64, URL-quoted (as in a URL's user info or
    query, ``+`` for a space or not) and escaped as JSON writes strings (``\/`` for ``/`` too, as some do)."""
    raw = secret.encode()
    found = {"raw": raw, "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode(), **_base64_cores(raw)}
    found |= {
        "url-quoted": quote(secret, safe="").encode(),
        "url-quoted+": quote_plus(secret).encode(),
        "url-quoted (lower-case hex)": re.sub(
            r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(secret, safe="")
        ).encode(),
        "json": json.dumps(secret)[1:-1].encode(),
        "json, / escaped": json.dumps(secret)[1:-1].replace("/", "\\/").encode(),
        "json, ascii": json.dumps(secret, ensure_ascii=True)[1:-1].encode(),
    }
    unique: dict[bytes, str] = {}
    for name, needle in found.items():
        unique.setdefault(needle, name)  # a form the same as another (no character to quote) is searched once
    return {name: needle for needle, name in unique.items()}


def _search(data: bytes, where: str, patterns: Mapping[str, Mapping[str, bytes]]) -> list[Finding]:
    return [
        Finding(where, name, encoding)
        for name, encodings in patterns.items()
        for encoding, needle in encodings.items()
        if needle in data
    ]


def find_secrets(evidence: Evidence, secrets: Mapping[str, str]) -> list[Finding]:
    """Every place of ``evidence`` holding one of ``secrets`` (name -> value) in any encoding of ``needles``."""
    short = [name for name, value in secrets.items() if len(value) < 16]
    if short:
        raise ValueError(f"secrets too short to search without false matches: {short}")
    patterns = {name: needles(value) for name, value in secrets.items()}
    found: list[Finding] = []
    for where, data in evidence.texts.items():
        found += _search(data, where, patterns)
    for path in evidence.files:
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue  # removed since it was listed (a rotated log, a finished run's temporary file)
        found += _search(data, str(path), patterns)
    return found


def describe(findings: Iterable[Finding]) -> str:
    return "\n".join(f"  {f.secret} ({f.encoding}) in {f.where}" for f in findings)
