"""Sphinx configuration of devplug's documentation site (``make docs``; checked by tests/test_docs_site.py).

Markdown sources (MyST); diagrams from Graphviz sources in ``diagrams/`` rendered to SVG by Debian's ``dot``
during the build (tools/docs/setup.sh installs it), each shown at the page's width and linked to itself at full size
(tools/docs/diagrams.py); the figures of ``make bench`` quoted from its committed record, ``bench/record.json``
(tools/docs/benchfigures.py); the Furo theme, whose tables scroll inside the content column, with code that wraps
(``_static/devplug.css``). Furo uses the system's fonts and ships its scripts: nothing is fetched from the network.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "core"))
sys.path.insert(0, str(ROOT / "tools" / "docs"))  # the extensions: benchfigures, diagrams

import devplug  # noqa: E402  (after the path: the version of the tree being documented)

project = "devplug"
author = "the devplug authors"
copyright = "the devplug authors, Apache-2.0"
version = release = devplug.__version__

extensions = ["myst_parser", "diagrams", "benchfigures"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Links to a heading of another page (`page.md#anchor`) resolve to GitHub-style anchors, and a missing one is a
# warning (an error under -W).
myst_heading_anchors = 3

graphviz_output_format = "svg"
graphviz_dot_args = ["-Gfontname=sans-serif", "-Nfontname=sans-serif", "-Efontname=sans-serif"]

# The figures of record of `make bench` (python -m bench.record writes them), relative to this folder.
bench_record = "../bench/record.json"

html_theme = "furo"
html_title = f"devplug {release}"
html_static_path = ["_static"]
html_css_files = ["devplug.css"]
html_theme_options = {"top_of_page_buttons": []}  # no "edit this page" (a link to a forge the site cannot check)
html_show_sourcelink = False
html_copy_source = False
