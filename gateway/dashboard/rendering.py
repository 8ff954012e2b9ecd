"""Server-rendered pages: the Jinja2 environment (autoescaping on), its number filters, and the response helper
that sets the dashboard's security headers on every page."""

from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

BASE = "/dashboard"
"""Where the dashboard is mounted; every link of its pages starts with it."""

TEMPLATES = Path(__file__).resolve().parent / "templates"

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every page: only this origin's scripts and styles, nothing inline (model output
rendered into a page can never run), images inline as ``data:`` (the charts a cell displayed)."""

SECURITY_HEADERS = {
    "Content-Security-Policy": PAGE_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def interval(row: dict[str, Any] | None) -> str:
    """A rate with its 95% interval and what it is over (``services.results.estimates``' fields): ``62.5% [41.0-84.0] of
    8``, or a dash when no task was decided."""
    if not row or row.get("mean") is None:
        return "–"
    text = percent(row["mean"])
    if row.get("ci_low") is not None:
        text += f" [{100 * row['ci_low']:.1f}–{100 * row['ci_high']:.1f}]"
    return f"{text} of {row['tasks']}"


def points(value: float | None) -> str:
    """A difference of rates in percentage points, signed: ``+12.5 pt``; None as an en dash."""
    return "–" if value is None else f"{100 * value:+.1f} pt"


def percent(value: float | None, digits: int = 1) -> str:
    """``0.1234`` as ``12.3%``; None as an en dash."""
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def seconds(value: float | None) -> str:
    """A duration, in ms below a second, in s below ten minutes, else in min; None as an en dash."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 600:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def count(value: int | float | None) -> str:
    """A count with thousands separated by thin spaces; None as an en dash."""
    return "–" if value is None else f"{value:,.0f}".replace(",", "\u2009")


def when(value: datetime | None) -> str:
    """A timestamp to the second, in UTC."""
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The dashboard's Jinja2 environment (made once): autoescaping for every template, undefined names raise."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(percent=percent, seconds=seconds, count=count, when=when, interval=interval, points=points)
    env.globals["base"] = BASE
    return env


def render(request: Request, template: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    """Render a page with the dashboard's security headers; the session (or None) is in the context as ``session``.

    Raises:
        jinja2.TemplateError: a template is broken (a bug, answered 500).
    """
    page = environment().get_template(template)
    session = getattr(request.state, "dashboard_session", None)
    html = page.render(session=session, path=request.url.path, **context)
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
