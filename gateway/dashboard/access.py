"""Who is looking, and what they may see: the session dependency, the CSRF check of forms, and the evaluation
lookup that goes through the REST API's own authorisation (``gateway.routers.evaluations.owned``).

Errors of the dashboard are pages, not problem documents::

    PageError          a page that says what went wrong, with its status (403, 404, 409, ...)
    SignInRequired     no valid session: pages redirect to the sign-in form, other resources answer 401
"""

import hmac
import secrets
from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from gateway.auth import count_request
from gateway.dashboard.rendering import BASE, render
from gateway.dashboard.sessions import Session, SessionStore
from gateway.deps import RedisDep, SettingsDep, StateDep
from gateway.problems import Problem
from gateway.routers.evaluations import owned
from services.errors import StoreError
from services.evaluation import Evaluation
from services.state import EvaluationNotFoundError

COOKIE = "pbe_dashboard"
"""The session cookie's name (HttpOnly, SameSite=Lax, path ``/dashboard``)."""

LOGIN_COOKIE = "pbe_dashboard_login"
"""The sign-in form's CSRF cookie (HttpOnly, SameSite=Strict, path ``/dashboard/login``): the form must send back
the same random value, so another site cannot sign a browser in with the other site's key."""

LOGIN_TOKEN_TTL_S = 3600
"""How long a sign-in form may stay open before it must be reloaded."""

MAX_FORM_BYTES = 16 * 1024
"""The largest form body the dashboard reads (a sign-in, a button)."""


class PageError(Exception):
    """An error shown as a dashboard page with ``status`` (the page says ``title`` and ``detail``; ``headers`` go
    with it, e.g. ``Retry-After``)."""

    def __init__(self, status: int, title: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.headers = headers or {}


class SignInRequired(Exception):
    """The request has no valid session. ``page``: a page (redirected to the sign-in form) or not (401)."""

    def __init__(self, page: bool) -> None:
        super().__init__("sign in with an API key of this service")
        self.page = page


def session_store(request: Request, redis: RedisDep, settings: SettingsDep) -> SessionStore:
    admin = settings.ADMIN_KEY.get_secret_value() if settings.ADMIN_KEY else None
    return SessionStore(redis, admin, settings.DASHBOARD_SESSION_TTL_S)


Sessions = Annotated[SessionStore, Depends(session_store)]


def optional_session(request: Request, sessions: Sessions, settings: SettingsDep) -> Session | None:
    """The request's session, or None; kept on ``request.state`` for the page's header. A signed-in request counts
    against its key's rate like an API request (pages, previews, downloads and streams alike).

    Raises:
        PageError: 429 past the key's rate, with ``Retry-After``.
    """
    session = sessions.resolve(request.cookies.get(COOKIE))
    request.state.dashboard_session = session
    if session is not None:
        try:
            count_request(sessions.redis, session.key, settings.RATE_LIMIT_PER_MINUTE)
        except Problem as exc:
            raise PageError(exc.status, exc.title, exc.detail, exc.headers) from None
    return session


def page_session(session: Annotated[Session | None, Depends(optional_session)]) -> Session:
    """The session of a page request.

    Raises:
        SignInRequired: no valid session (the browser is sent to the sign-in form, and back after it).
    """
    if session is None:
        raise SignInRequired(page=True)
    return session


def resource_session(session: Annotated[Session | None, Depends(optional_session)]) -> Session:
    """The session of a download, an image or an event stream.

    Raises:
        SignInRequired: no valid session (401).
    """
    if session is None:
        raise SignInRequired(page=False)
    return session


PageSession = Annotated[Session, Depends(page_session)]
ResourceSession = Annotated[Session, Depends(resource_session)]


def visible_evaluation(state: StateDep, session: Session, evaluation_id: str) -> Evaluation:
    """The evaluation if the session's key may see it (the REST API's rule: its own, or all for an admin).

    Raises:
        PageError: 404 when there is none or it is another key's (the two are not told apart, as in the API).
    """
    try:
        return owned(state, session.key, evaluation_id)
    except (EvaluationNotFoundError, StoreError):
        raise PageError(
            404,
            "Evaluation not found",
            f"There is no evaluation {evaluation_id!r} that this key may see. The runs page lists yours.",
        ) from None


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded body of a form, first value per field.

    Raises:
        PageError: 413 for a body past ``MAX_FORM_BYTES``, 415 for a body that is not urlencoded.
    """
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise PageError(415, "Unsupported form", "The dashboard's forms are sent urlencoded.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise PageError(413, "Form too large", f"A dashboard form is at most {MAX_FORM_BYTES} bytes.")
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=20)
    return {name: values[0] for name, values in fields.items()}


def check_same_origin(request: Request) -> None:
    """Refuse a form posted from another site (its ``Origin``, or else ``Referer``, must be this host).

    Raises:
        PageError: 403 when the form came from elsewhere.
    """
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None or origin == "null":
        return  # some privacy settings send neither; the CSRF token still guards state changes
    host = request.headers.get("host", "")
    if origin.split("://", 1)[-1].split("/", 1)[0] != host:
        raise PageError(403, "Form from another site", "This form was not sent from this dashboard's pages.")


def check_csrf(request: Request, session: Session, form: dict[str, str]) -> None:
    """A state-changing form must come from this site and carry its session's CSRF token.

    Raises:
        PageError: 403 when it does not.
    """
    check_same_origin(request)
    if not session.csrf or not hmac.compare_digest(form.get("csrf", ""), session.csrf):
        raise PageError(403, "Form expired", "This form's token does not match your session; reload the page.")


def new_login_token() -> str:
    """A random value for the sign-in form and its cookie (``LOGIN_COOKIE``)."""
    return secrets.token_urlsafe(24)


def check_login_token(request: Request, form: dict[str, str]) -> None:
    """A sign-in must come from this site's sign-in form: its ``csrf`` field equals the form's cookie.

    Raises:
        PageError: 403 when the form came from elsewhere or its cookie is gone (expired, or cookies are off).
    """
    check_same_origin(request)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(form.get("csrf", ""), expected):
        raise PageError(
            403,
            "Sign-in form expired",
            "This sign-in was not sent from this dashboard's current sign-in form (or cookies are off): "
            "open the sign-in page again and allow cookies for this site.",
        )


class PageRoute(APIRoute):
    """A dashboard route whose malformed request (a task number that is not a number, a value past its limit) is
    answered with a page saying so, not with the REST API's problem document."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                fields = ", ".join(".".join(str(p) for p in error.get("loc", ())[1:]) for error in exc.errors())
                detail = f"This address has a value the dashboard cannot read ({fields or 'the request'}). "
                detail += "Follow the dashboard's own links instead."
                context = {"title": "Bad address", "detail": detail}
                return render(request, "error.html", context, status_code=422)

        return page_handler


def install_error_pages(app: FastAPI) -> None:
    """Show the dashboard's errors as pages: ``PageError`` with its status, ``SignInRequired`` as a redirect to the
    sign-in form (pages) or a 401 page (other resources)."""

    @app.exception_handler(PageError)
    async def _page_error(request: Request, exc: PageError) -> HTMLResponse:
        page = render(request, "error.html", {"title": exc.title, "detail": exc.detail}, status_code=exc.status)
        page.headers.update(exc.headers)
        return page

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        if exc.page and request.method == "GET":
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{BASE}/login?next={quote(target, safe='')}", status_code=303)
        request.state.dashboard_session = None
        context = {"title": "Sign-in required", "detail": "Sign in with an API key of this service."}
        return render(request, "error.html", context, status_code=401)
