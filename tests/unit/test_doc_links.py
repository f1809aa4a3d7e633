"""Every relative link in README.md and docs/*.md resolves: the file exists and its ``#anchor`` is a heading there,
by GitHub's rules for heading anchors (lower case; punctuation but ``-`` and ``_`` dropped; spaces to ``-``; a
repeated heading gets ``-1``, ``-2``). Links inside code blocks and code spans are code, not links."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_streamgroup.dagster.devserver import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1, with their code spans blanked out."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub("", line)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: its rendered text (link targets, emphasis and code marks dropped),
    lower-cased, everything but letters, digits, ``_``, ``-`` and spaces removed, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(HTML_ANCHOR.findall(line))
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for number, line in prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                broken.append(
                    f"{where}: no file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}"
                )
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: no heading with the anchor #{anchor} in {resolved.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("A production host's layout (2026-11-29, afternoon)", "a-production-hosts-layout-2026-11-29-afternoon"),
        ("With the Delta sink (`--sink delta`, 2026-12-07)", "with-the-delta-sink---sink-delta-2026-12-07"),
        (
            "`bench.recovery`: each side killed mid-drain (2026-11-27)",
            "benchrecovery-each-side-killed-mid-drain-2026-11-27",
        ),
        (
            "Against Spark's own Kafka source (`ratio_spark_kafka`, 2026-11-26)",
            "against-sparks-own-kafka-source-ratio_spark_kafka-2026-11-26",
        ),
        ("The same group in YAML (a [Dagster component](https://x.y))", "the-same-group-in-yaml-a-dagster-component"),
        ("**Bold** and x \N{MULTIPLICATION SIGN} y", "bold-and-x--y"),  # a symbol: dropped
    ],
)
def test_github_slugs(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#title) [ok](docs/a.md#twice-1) [ok](#top) [web](https://example.com/x#y)\n"
        "`[code](missing.md)`\n```\n[code](missing.md)\n```\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#twice-2)\n\n# Top\n"
    )
    assert broken_links(page) == [
        "README.md:6: docs/b.md: no file docs/b.md",
        "README.md:6: docs/a.md#twice-2: no heading with the anchor #twice-2 in docs/a.md",
    ]
