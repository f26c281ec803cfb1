"""An answer's Markdown as HTML the page can show: rendered by markdown-it-py, then sanitized by nh3.

The answer comes from a model that was shown the user's documents, so its text is untrusted: raw
HTML in it is not passed through by the renderer (``html=False``: it shows as text), and the
rendered HTML is then cleaned by nh3 (the ammonia sanitizer) to an allowlist of formatting tags
with no attributes but a link's ``href`` (http, https or mailto) and ``title``, and a code block's
language class. No script, style, image, form or event handler gets through, and links open
without the page's referrer or window. ``[n]`` citation markers stay text; the page turns them
into buttons.
"""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

_RENDERER = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
_TAGS = frozenset(
    "a p br hr strong em del code pre blockquote ul ol li h1 h2 h3 h4 h5 h6 table thead tbody tr th td".split()
)
_ATTRIBUTES = {"a": {"href", "title"}, "code": {"class"}, "ol": {"start"}, "th": {"style"}, "td": {"style"}}
_URL_SCHEMES = frozenset({"http", "https", "mailto"})


def render_answer(text: str) -> str:
    """``text`` (Markdown) as sanitized HTML."""
    html = _RENDERER.render(text)
    return nh3.clean(
        html,
        tags=set(_TAGS),
        attributes={tag: set(names) for tag, names in _ATTRIBUTES.items()},
        url_schemes=set(_URL_SCHEMES),
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )
