"""Strings taken from a trace, made safe for the HTML and Markdown the app renders.

A trace is untrusted: `header.method` may be `<img src=x>` and a token's text may be `](http://...)`
or a backtick. Everything a trace names (method, fault, model names, token text, file names) goes
through one of these before it is put into Markdown, HTML or a plotly hover (which renders a subset
of HTML, links included). Lengths are capped too: a header field is a label, not a document.
"""

from __future__ import annotations

import html
import re

MAX_LABEL_CHARS = 200
# Markdown punctuation that acts mid-line: emphasis, links and images, code, table cells, strikes.
# (Line-start syntax such as `#`, `-` or `1.` cannot act: the text is one line, placed mid-line.)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())  # one line: a newline could start a heading or a table row
    return text if len(text) <= limit else text[: limit - 1] + "…"


def md_text(value: object, limit: int = MAX_LABEL_CHARS) -> str:
    """Literal text inside Markdown: HTML escaped, Markdown punctuation backslash-escaped, one line."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(_clip(str(value), limit), quote=True))


def html_text(value: object, limit: int = MAX_LABEL_CHARS) -> str:
    """Literal text inside HTML (or a plotly hover): escaped, one line, capped."""
    return html.escape(_clip(str(value), limit), quote=True)


def plain_text(value: object, limit: int = MAX_LABEL_CHARS) -> str:
    """Trace text for a reader that shows text, not markup (Perfetto's args, a file name): one
    line, capped, control characters dropped."""
    return "".join(c for c in _clip(str(value), limit) if c.isprintable())
