"""Sphinx extension: each Graphviz diagram shown at the page's width and opening at full size.

sphinx.ext.graphviz renders a diagram to SVG (``graphviz_output_format = "svg"``) inside an ``<object>``, which
takes the clicks and cannot be a link. Here the same SVG file is an ``<img>`` (scaled to the content column by
``_static/devplug.css``) inside a link to itself, with a visible "open at full size" link under it: the SVG
opens on its own at its natural size, every label at the size it was drawn. Other builders keep the extension's
own rendering.
"""

from __future__ import annotations

from html import escape
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.ext.graphviz import GraphvizError, graphviz, render_dot
from sphinx.util import logging
from sphinx.writers.html5 import HTML5Translator

__all__ = ["setup"]

logger = logging.getLogger(__name__)


def visit_graphviz(self: HTML5Translator, node: graphviz) -> None:
    try:
        fname, _ = render_dot(self, node["code"], node["options"], "svg", "graphviz", node.get("filename"))
    except GraphvizError as exc:
        logger.warning("dot code %r: %s", node["code"], exc, location=node)
        raise nodes.SkipNode from exc
    if fname is None:  # graphviz_dot is not there and the build goes on without images
        raise nodes.SkipNode
    src = escape(fname.as_posix(), quote=True)
    alt = escape(node.get("alt", "a diagram"), quote=True)
    self.body.append(
        f'<div class="graphviz diagram"><a class="diagram-image" href="{src}" title="Open the diagram at full size">'
        f'<img src="{src}" alt="{alt}" class="graphviz" /></a>'
        f'<a class="diagram-full-size" href="{src}">Open the diagram at full size</a></div>\n'
    )
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.graphviz")
    app.add_node(graphviz, override=True, html=(visit_graphviz, None))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
