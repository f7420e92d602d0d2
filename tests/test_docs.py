"""The documentation's shape: a short README that starts from the two commands, and no broken relative links.

Fast and offline: reads README.md and docs/*.md only. A relative link (markdown link, image or reference-style
definition, outside code) must name a path that exists inside the repository (a file, or a folder such as
`decoders/`), resolved from the page that holds it; a `page.md#anchor` link must also name a heading of that
page. Links with a scheme (https:, mailto:, ...) and pure `#anchor` links are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The page without fenced code blocks and code spans, whose brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return INLINE.findall(prose) + REFDEF.findall(prose)


def anchors(text: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, -1, -2 ... for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", text)):
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_readme_is_short_and_starts_from_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines; the limit is 200"
    assert "make demo" in text and "make test" in text


def test_the_pages_exist():
    assert len(PAGES) > 1, "README.md links to docs/*.md pages"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path.split("?")[0]).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"{target} (no such path in the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            broken.append(f"{target} (no heading #{anchor} in {resolved.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_the_link_finder_finds_links_and_skips_code():
    text = ("see [a](docs/a.md) and ![img](b.png \"title\") and [x][r]\n\n[r]: c/d.md\n"
            "`[not](a link)`\n```\n[nor](this)\n```\n")
    assert links(text) == ["docs/a.md", "b.png", "c/d.md"]
    assert anchors("# A `b` (c)\n## 4. SSD+CSD: x\n## A b c\n") == {"a-b-c", "4-ssdcsd-x", "a-b-c-1"}
