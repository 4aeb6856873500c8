"""The README and the pages under docs/: every relative link resolves, the README stays short, no internal shorthand.

Links are read as GitHub renders them: inline links and images, and reference definitions, outside code
(fenced blocks and code spans, where brackets are only text). A target's ``#anchor`` into a Markdown page
must name one of its headings by GitHub's slug rule.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Final
from urllib.parse import unquote

import pytest

REPO: Final = Path(__file__).resolve().parents[2]
README: Final = REPO / "README.md"
GENERATED: Final = REPO / "docs" / "benchmarks.md"
"""Written by ``./dev bench`` from the stored results: checked for its links, not for its wording."""
PAGES: Final = (README, *sorted((REPO / "docs").glob("*.md")))
README_MAX_LINES: Final = 200

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_EXTERNAL = ("http://", "https://", "mailto:")
_SEED = re.compile(r"\bseeds?\s+\d{1,3}\b", re.IGNORECASE)


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with code spans blanked out."""
    lines: list[str] = []
    fence = ""
    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = ""
            continue
        if opening:
            fence = opening.group(1)
            continue
        lines.append(_CODE_SPAN.sub("", line))
    return lines


def _links(page: Path) -> list[str]:
    """Every link target of ``page``, in order."""
    targets: list[str] = []
    for line in _prose_lines(page.read_text()):
        targets += _INLINE_LINK.findall(line)
        reference = _REFERENCE.match(line)
        if reference:
            targets.append(reference.group(1))
    return targets


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower-case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, a repeated one numbered as GitHub numbers it (``-1``, ``-2``)."""
    seen: Counter[str] = Counter()
    anchors: set[str] = set()
    in_fence = ""
    for line in page.read_text().splitlines():
        opening = _FENCE.match(line)
        if in_fence:
            if opening and opening.group(1)[0] == in_fence[0] and len(opening.group(1)) >= len(in_fence):
                in_fence = ""
            continue
        if opening:
            in_fence = opening.group(1)
            continue
        heading = _HEADING.match(line)
        if heading:
            base = _slug(heading.group(1))
            anchors.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return anchors


def _problems(page: Path) -> list[str]:
    """What is wrong with ``page``'s relative links: a missing file or directory, or an anchor naming no heading."""
    problems: list[str] = []
    for target in _links(page):
        if target.startswith(_EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file or directory")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in _anchors(resolved):
            problems.append(f"{target}: no heading with that anchor")
    return problems


def _page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def test_headings_slug_as_github_does() -> None:
    """Code spans keep their text, punctuation goes but for hyphens and underscores, and spaces become hyphens."""
    assert _slug("2b. Hub capacity with cache streams") == "2b-hub-capacity-with-cache-streams"
    assert _slug("What `./dev` does") == "what-dev-does"
    assert _slug("What a local process can make the local API spend, and what the edge's commands trust") == (
        "what-a-local-process-can-make-the-local-api-spend-and-what-the-edges-commands-trust"
    )
    assert _slug("A [linked](x.md) snake_case heading") == "a-linked-snake_case-heading"


def test_links_are_read_from_prose_only(tmp_path: Path) -> None:
    """Links in fenced blocks and code spans are text; inline links, images and reference definitions count."""
    page = tmp_path / "page.md"
    page.write_text('See [a](a.md#top), ![b](b.png) and `[not](c.md)`.\n```\n[not](d.md)\n```\n[ref]: e/ "title"\n')
    assert _links(page) == ["a.md#top", "b.png", "e/"]


def test_a_missing_target_or_anchor_is_a_problem(tmp_path: Path) -> None:
    """A link to a file that is not there, or to a heading the page lacks, is reported; a good one is not."""
    (tmp_path / "other.md").write_text("# Title\n\n## Part two\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#part-two) [dir](./) [web](https://example.com/x) [here](#own)\n"
        "[gone](missing.md) [bad](other.md#not-a-heading)\n\n## Own\n"
    )
    assert _problems(page) == [
        "missing.md: no such file or directory",
        "other.md#not-a-heading: no heading with that anchor",
    ]


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_in_the_docs_resolves(page: Path) -> None:
    """Each relative link of the README and of docs/*.md names an existing file or directory, and heading."""
    assert _problems(page) == []


def test_the_readme_stays_short() -> None:
    """The README is an entry point of at most 200 lines; the detail lives under docs/."""
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


@pytest.mark.parametrize("page", [p for p in PAGES if p != GENERATED], ids=_page_id)
def test_no_page_a_user_reads_names_internal_seed_numbers(page: Path) -> None:
    """Internal shorthand such as "seed 002" is replaced by what it names (the generated benchmarks page aside)."""
    assert _SEED.findall(page.read_text()) == []
