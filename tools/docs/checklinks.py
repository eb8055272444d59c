"""Check a built documentation site offline: every internal link and anchor resolves, nothing loads from the network.

    python tools/docs/checklinks.py build/docs

Reads every HTML page under the folder. A relative ``href`` or ``src`` must name a file of the site and, with a
``#fragment``, an element of that page with that ``id``; a page, script, style sheet, image or frame loaded from
another host (``<script src="https://...">``, a CSS ``url(https://...)``) is an error, since the site must work
without a network. Links to other sites (``<a href="https://...">``) are left alone: no test may reach them.
Exits 1 listing every problem (page, link, what is wrong), 0 when there is none.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["Page", "check_site", "main"]

#: Attributes that load a resource into the page (as opposed to an ``<a href>`` the reader may follow).
_LOADING = {("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src"), ("source", "src")}
_CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*(https?:)?//""", re.I)


class Page(HTMLParser):
    """One HTML page's ids and the links it makes: ``(tag, attribute, value)``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append((tag, name, value))


def _parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def check_site(site: Path) -> list[str]:
    """Every problem of the site under ``site``, one line each (empty: none)."""
    site = site.resolve()
    pages = {path: _parse(path) for path in sorted(site.rglob("*.html"))}
    if not pages:
        return [f"{site}: no HTML page (was the site built?)"]
    problems = []
    for path, page in pages.items():
        where = path.relative_to(site)
        for tag, attribute, value in page.links:
            parts = urlsplit(value)
            if parts.scheme in ("http", "https") or value.startswith("//"):
                if (tag, attribute) in _LOADING:
                    problems.append(f"{where}: <{tag} {attribute}={value!r}> loads from the network")
                continue
            if parts.scheme:  # mailto:, data:, javascript:
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.is_relative_to(site):
                problems.append(f"{where}: {value!r} points outside the site")
                continue
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{where}: {value!r}: no such file {target.relative_to(site)}")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if fragment not in ids:
                    problems.append(f"{where}: {value!r}: {target.relative_to(site)} has no anchor #{fragment}")
    for sheet in sorted(site.rglob("*.css")):
        for number, line in enumerate(sheet.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _CSS_URL.search(line):
                problems.append(f"{sheet.relative_to(site)}:{number}: loads from the network: {line.strip()[:120]}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/docs/checklinks.py SITE_FOLDER", file=sys.stderr)
        return 2
    problems = check_site(Path(argv[0]))
    for problem in problems:
        print(f"checklinks: {problem}", file=sys.stderr)
    if problems:
        print(f"checklinks: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"checklinks: {argv[0]}: every internal link and anchor resolves; nothing loads from the network")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
