"""The web page's answers as HTML: Markdown rendered, and nothing from the model or the documents injected."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from apps.web.markdown import render_answer
from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.test_web_server import ask, client_for, upload

ALLOWED = {"a", "p", "br", "hr", "strong", "em", "del", "code", "pre", "blockquote", "ul", "ol", "li",
           "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"}  # fmt: skip
HOSTILE = [
    "<script>window.pwned = 1</script>",
    "Before <SCRIPT src=//evil.example/x.js></SCRIPT> after",
    '<img src=x onerror="window.pwned = 1">',
    "<svg onload=alert(1)><circle/></svg>",
    '<a href="javascript:alert(1)">click</a>',
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](jav&#x61;script:alert(1))",
    "[click](  javascript:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[click](vbscript:msgbox(1))",
    "<javascript:alert(1)>",
    '[t](http://ok.example "x\\" onmouseover=\\"alert(1)")',
    "![x](http://evil.example/track.png)",
    '<iframe src="http://evil.example"></iframe>',
    "<style>body { display: none }</style>",
    '<div style="background:url(javascript:alert(1))">x</div>',
    '<form action="http://evil.example"><input name=q></form>',
    "**bold <b onclick=alert(1)>x</b>**",
    "`<script>alert(1)</script>`",
    "```html\n<script>alert(1)</script>\n```",
    "| a | b |\n|---|---|\n| <img src=x onerror=alert(1)> | [y](javascript:z) |",
    "- item\n  <details open ontoggle=alert(1)>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
]


class Tags(HTMLParser):
    """Every start tag with its attributes, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(html)
    parser.close()
    return parser.tags


def test_markdown_is_rendered() -> None:
    html = render_answer("- **Early bake**: 3:30 to 11:30 [1]\n- *Day*: 9:00 to 17:00\n\nSee `tidepool unlock`.")
    assert html.startswith("<ul>\n<li><strong>Early bake</strong>: 3:30 to 11:30 [1]</li>")
    assert "<em>Day</em>" in html and "<code>tidepool unlock</code>" in html
    assert [t for t, _ in tags(render_answer("1. one\n2. two\n\n## Head\n\n| a |\n|---|\n| b |"))] == [
        "ol", "li", "li", "h2", "table", "thead", "tr", "th", "tbody", "tr", "td"]  # fmt: skip


def test_a_safe_link_stays_a_link_that_opens_without_the_page_s_referrer() -> None:
    [(tag, attrs)] = tags(render_answer("[the guide](https://example.org/guide)"))[1:]
    assert tag == "a" and attrs["href"] == "https://example.org/guide"
    assert set(attrs["rel"].split()) >= {"noopener", "noreferrer"}  # type: ignore[union-attr]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_markdown_and_html_cannot_inject(text: str) -> None:
    html = render_answer(text)
    for tag, attrs in tags(html):
        assert tag in ALLOWED, (tag, html)
        for name, value in attrs.items():
            assert not name.startswith("on") and name not in ("style", "src", "srcdoc", "action", "formaction"), html
            if name == "href":
                assert value is not None and value.split(":", 1)[0].lower() in ("http", "https", "mailto"), html
    assert "<script" not in html.lower() and "<img" not in html.lower()


def test_raw_html_in_an_answer_shows_as_text() -> None:
    assert render_answer("<script>alert(1)</script>") == "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>\n"
    assert render_answer('<img src=x onerror="x()">') == "<p>&lt;img src=x onerror=\"x()\"&gt;</p>\n"


@pytest.mark.timeout(60)
def test_the_done_event_carries_the_sanitized_html(tmp_path: Path) -> None:
    words = ["- **Sick", " leave**: 5 days", "\n- <img src=x onerror=alert(1)>", " [1]"]
    backend = ScriptedIndexer(words=words)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        with client_for(server) as c:
            upload(c, "a.md")
            event, done = ask(c, "sick leave?")[-1]
    assert event == "done" and done["text"] == "".join(words)
    assert done["html"] == render_answer(done["text"])
    assert "<strong>Sick leave</strong>" in done["html"] and "<img" not in done["html"]
