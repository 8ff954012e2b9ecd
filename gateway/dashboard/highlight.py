"""Python code as highlighted HTML, made on the server with Pygments (its formatter escapes the code); plain
escaped text when Pygments is not installed. The colours are a stylesheet served from the installed package's
style (``stylesheet``)."""

import importlib
from functools import lru_cache
from html import escape
from typing import Any

from markupsafe import Markup

CSS_CLASS = "code"
"""The class of the ``<div>`` that wraps highlighted code (the stylesheet is scoped to it)."""

STYLE = "friendly"
"""The Pygments style whose colours the stylesheet uses."""


@lru_cache(maxsize=1)
def _pygments() -> tuple[Any, Any, Any] | None:
    try:
        pygments = importlib.import_module("pygments")
        lexers = importlib.import_module("pygments.lexers")
        formatters = importlib.import_module("pygments.formatters")
    except ImportError:
        return None
    return pygments, lexers.PythonLexer(stripnl=False, ensurenl=False), formatters.HtmlFormatter(cssclass=CSS_CLASS)


def highlight_python(code: str) -> Markup:
    """``code`` as HTML: a ``<div class="code"><pre>`` with Pygments' token spans, every character escaped.
    Raises nothing (Pygments' lexer accepts any text)."""
    tools = _pygments()
    if tools is None:
        return Markup(f'<div class="{CSS_CLASS}"><pre>{escape(code)}</pre></div>')
    pygments, lexer, formatter = tools
    return Markup(pygments.highlight(code, lexer, formatter))


@lru_cache(maxsize=1)
def stylesheet() -> str:
    """The token colours for ``.code``, from the installed Pygments (empty without it)."""
    tools = _pygments()
    if tools is None:
        return ""
    formatters = importlib.import_module("pygments.formatters")
    css: str = formatters.HtmlFormatter(style=STYLE, cssclass=CSS_CLASS).get_style_defs(f".{CSS_CLASS}")
    return css
