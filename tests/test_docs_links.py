"""The documentation's links lead somewhere: every relative link in README.md, benchmarks/README.md
and docs/**/*.md names an existing file (and, with a ``#fragment``, a heading of that file), every
page is listed in the index docs/README.md, and every ``docs/….md`` path the code or the tests cite
exists.

Fragments follow GitHub's heading slugs: lower case, punctuation other than ``-`` and ``_`` dropped,
each space a ``-``, a repeated slug numbered ``-1``, ``-2``, ….
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
INDEX = DOCS / "README.md"
PAGES = sorted(
    [REPO / "README.md", REPO / "benchmarks" / "README.md", *DOCS.rglob("*.md")],
    key=lambda path: str(path),
)
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`+[^`\n]*`+")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
CITED = re.compile(r"\bdocs/[\w./-]+\.md\b")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are examples, not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    text = CODE_SPAN.sub(lambda span: span.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r'<a (?:name|id)="([^"]+)"', page.read_text(encoding="utf-8")))
    return found


def relative_links(page: Path) -> list[str]:
    prose = _prose(page.read_text(encoding="utf-8"))
    links = LINK.findall(prose) + IMAGE.findall(prose)
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        target, _, fragment = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{link}: no heading with that anchor in {_name(path)}")
    assert not broken, f"{_name(page)}: " + "; ".join(broken)


def test_the_index_lists_every_page() -> None:
    """A page nobody links from the index is a page nobody finds: docs/README.md lists them all."""
    listed = {(INDEX.parent / link.partition("#")[0]).resolve() for link in relative_links(INDEX)}
    pages = {page.resolve() for page in DOCS.rglob("*.md") if page != INDEX and "spec" not in page.parts}
    missing = sorted(_name(page) for page in pages - listed)
    assert not missing, f"add these pages to docs/README.md: {missing}"


def test_the_docs_the_code_cites_exist() -> None:
    """Docstrings and comments that send a reader to ``docs/….md`` send them to a page that exists."""
    cited: dict[str, list[str]] = {}
    for folder in ("scheduler", "tests", "benchmarks", "tools", "examples", "alembic"):
        for source in (REPO / folder).rglob("*.py"):
            for path in CITED.findall(source.read_text(encoding="utf-8")):
                cited.setdefault(path, []).append(_name(source))
    missing = {path: sources for path, sources in cited.items() if not (REPO / path).exists()}
    assert not missing, missing


def test_the_slugs_follow_github() -> None:
    assert slug("The outbox: `SchedulerStore.on_connection`") == "the-outbox-schedulerstoreon_connection"
    assert slug("Claims among concurrent workers") == "claims-among-concurrent-workers"
    assert slug("1. Crash safety — `test_crash_safety.py`") == "1-crash-safety--test_crash_safetypy"
