"""The dashboard's routes, under ``/dashboard``: sign-in and sign-out, the runs, an evaluation (with its live
progress, cancel and retry), a task (its trajectory, files, checks and judgment), compare and the leaderboard,
and the few static files the pages use. Access goes through the REST API's own rule (``access``): a key sees
what it owns, an admin everything; another key's evaluation is a 404 page.
"""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse

from gateway import readmodel
from gateway import streams as live
from gateway.dashboard import views
from gateway.dashboard.access import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_TOKEN_TTL_S,
    PageError,
    PageRoute,
    PageSession,
    ResourceSession,
    Sessions,
    check_csrf,
    check_login_token,
    install_error_pages,
    new_login_token,
    read_form,
    visible_evaluation,
)
from gateway.dashboard.files import file_response, suite_path
from gateway.dashboard.highlight import stylesheet
from gateway.dashboard.rendering import BASE, render
from gateway.deps import LifecycleDep, StateDep, StoreDep, StreamsDep, SuiteDep
from gateway.notebook import build_notebook
from gateway.routers.leaderboard import get_leaderboard
from services.errors import ArtifactExpiredError, ArtifactNotFoundError, TaskNotFoundError
from services.evaluation import Evaluation, EvaluationStatus
from services.state import StateStore
from services.verdict import VerdictStatus

STATIC = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}

router = APIRouter(prefix=BASE, include_in_schema=False, route_class=PageRoute)


def _safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of the dashboard only (never another site)."""
    if not target:
        return f"{BASE}/runs"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith(BASE + "/") or "\\" in target:
        return f"{BASE}/runs"
    return target


@router.get("")
def home() -> RedirectResponse:
    return RedirectResponse(f"{BASE}/runs", status_code=303)


def _login_page(request: Request, target: str, problem: str, status_code: int = 200) -> HTMLResponse:
    """The sign-in form with a fresh CSRF value, set in its cookie too."""
    request.state.dashboard_session = None
    token = new_login_token()
    context = {"next": target, "problem": problem, "login_csrf": token}
    response = render(request, "login.html", context, status_code=status_code)
    response.set_cookie(
        LOGIN_COOKIE,
        token,
        max_age=LOGIN_TOKEN_TTL_S,
        path=f"{BASE}/login",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.get("/login")
def login_form(request: Request, next: str | None = None) -> HTMLResponse:  # noqa: A002 - the query's name
    return _login_page(request, _safe_next(next), "")


@router.post("/login")
async def login(request: Request, sessions: Sessions) -> Response:
    form = await read_form(request)
    check_login_token(request, form)
    target = _safe_next(form.get("next"))
    opened = sessions.open(form.get("key", "")) if form.get("key", "").strip() else None
    if opened is None:
        problem = "That key is not an active API key of this service. Ask the operator for one."
        return _login_page(request, target, problem, status_code=401)
    token, _ = opened
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(LOGIN_COOKIE, path=f"{BASE}/login")
    response.set_cookie(
        COOKIE,
        token,
        max_age=sessions.ttl_s,
        path=BASE,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request, session: PageSession, sessions: Sessions) -> Response:
    check_csrf(request, session, await read_form(request))
    sessions.close(session)
    response = RedirectResponse(f"{BASE}/login", status_code=303)
    response.delete_cookie(COOKIE, path=BASE)
    return response


def _since(text: str) -> datetime | None:
    """Raises: PageError: 422 for a date that is not YYYY-MM-DD."""
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise PageError(422, "Bad date", f"{text!r} is not a date like 2026-11-25.") from None


@router.get("/runs")
def runs(
    request: Request,
    session: PageSession,
    state: StateDep,
    model: Annotated[str, Query(max_length=256)] = "",
    status: Annotated[str, Query(max_length=32)] = "",
    since: Annotated[str, Query(max_length=10)] = "",
) -> HTMLResponse:
    owner = None if session.key.admin else session.key.id
    rows = views.run_rows(state, owner, model=model, status=status, since=_since(since))
    running = [r.evaluation.id for r in rows if r.status in (EvaluationStatus.QUEUED, EvaluationStatus.RUNNING)]
    followed = running[: live.MAX_FOLLOWED]
    context = {
        "rows": rows,
        "events": f"{BASE}/runs/events?{urlencode([('ids', i) for i in followed])}" if followed else "",
        "filters": {"model": model, "status": status, "since": since},
        "statuses": [s.value for s in EvaluationStatus],
    }
    return render(request, "runs.html", context)


def _filters(category: str, verdict: str, end_reason: str) -> dict[str, str]:
    return {"category": category, "verdict": verdict, "end_reason": end_reason}


@router.get("/evaluations/{evaluation_id}")
def evaluation(
    request: Request,
    evaluation_id: str,
    session: PageSession,
    state: StateDep,
    store: StoreDep,
    suite: SuiteDep,
    category: Annotated[str, Query(max_length=64)] = "",
    verdict: Annotated[str, Query(max_length=32)] = "",
    end_reason: Annotated[str, Query(max_length=32)] = "",
) -> HTMLResponse:
    found = visible_evaluation(state, session, evaluation_id)
    page = views.evaluation_page(state, store, suite, found, _filters(category, verdict, end_reason))
    owner = session.key.admin or session.key.id == found.owner
    context = {"page": page, "owner": owner, "verdicts": [v.value for v in VerdictStatus]}
    return render(request, "evaluation.html", context)


@router.get("/evaluations/{evaluation_id}/events")
def evaluation_events(
    evaluation_id: str, session: ResourceSession, state: StateDep, streams: StreamsDep
) -> StreamingResponse:
    """The evaluation's live progress and verdicts for the page's script (``gateway.streams``)."""
    found = visible_evaluation(state, session, evaluation_id)
    return live.event_response(streams, session.key.id, state, [found.id], verdicts=True)


@router.get("/runs/events")
def runs_events(
    session: ResourceSession,
    state: StateDep,
    streams: StreamsDep,
    ids: Annotated[list[str] | None, Query(max_length=live.MAX_FOLLOWED)] = None,
) -> StreamingResponse:
    """The live progress of the runs list's running evaluations, in one stream (``gateway.streams``)."""
    chosen = [i for i in dict.fromkeys(ids or []) if i]
    if not chosen:
        raise PageError(422, "Nothing to follow", "Name the evaluations to follow: ?ids=<id>&ids=<id>.")
    found = [visible_evaluation(state, session, evaluation_id).id for evaluation_id in chosen]
    return live.event_response(streams, session.key.id, state, found, verdicts=False)


async def _owned_for_change(request: Request, session: PageSession, state: StateDep, evaluation_id: str) -> str:
    """The evaluation a cancel or retry form changes, once the form's token and the key's rights are checked.

    Raises:
        PageError: 403 for a bad form or a key that does not own it; 404 when it cannot see it.
    """
    check_csrf(request, session, await read_form(request))
    found = visible_evaluation(state, session, evaluation_id)
    if not (session.key.admin or session.key.id == found.owner):
        raise PageError(403, "Not yours", "Only the key that submitted this evaluation (or an admin) may change it.")
    return found.id


@router.post("/evaluations/{evaluation_id}/cancel")
async def cancel(
    request: Request, evaluation_id: str, session: PageSession, state: StateDep, lifecycle: LifecycleDep
) -> RedirectResponse:
    found = await _owned_for_change(request, session, state, evaluation_id)
    lifecycle.cancel(found)
    return RedirectResponse(f"{BASE}/evaluations/{found}", status_code=303)


@router.post("/evaluations/{evaluation_id}/retry")
async def retry(
    request: Request, evaluation_id: str, session: PageSession, state: StateDep, lifecycle: LifecycleDep
) -> RedirectResponse:
    found = await _owned_for_change(request, session, state, evaluation_id)
    if state.cancelled(found):
        raise PageError(409, "Evaluation cancelled", "A cancelled evaluation is not run again; submit a new one.")
    for verdict in state.verdicts(found):
        if verdict.status in readmodel.RETRYABLE:
            lifecycle.retry(found, verdict.task_index)
    return RedirectResponse(f"{BASE}/evaluations/{found}", status_code=303)


def _task_url(evaluation_id: str, task_index: int) -> str:
    return f"{BASE}/evaluations/{evaluation_id}/tasks/{task_index}"


@router.get("/evaluations/{evaluation_id}/tasks/{task_index}")
def task(
    request: Request,
    evaluation_id: str,
    task_index: int,
    session: PageSession,
    state: StateDep,
    store: StoreDep,
    suite: SuiteDep,
    attempt: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> HTMLResponse:
    found = visible_evaluation(state, session, evaluation_id)
    try:
        page = views.task_page(state, store, suite, found, task_index, attempt, _task_url(found.id, task_index))
    except ArtifactExpiredError as exc:
        raise PageError(410, "Artifacts expired", str(exc)) from None
    except TaskNotFoundError:
        raise PageError(404, "Task not found", f"Evaluation {found.id} has no task {task_index}.") from None
    return render(request, "task.html", {"page": page, "task_url": _task_url(found.id, task_index)})


def _chosen_attempt(state: StateStore, evaluation: Evaluation, task_index: int, attempt: int | None) -> int:
    """The attempt asked for, else the task's latest (``readmodel.chosen_attempt``).

    Raises:
        PageError: 404 when the evaluation has no such task.
    """
    try:
        return readmodel.chosen_attempt(state, evaluation, task_index, attempt)
    except TaskNotFoundError:
        raise PageError(404, "Task not found", f"Evaluation {evaluation.id} has no task {task_index}.") from None


@router.get("/evaluations/{evaluation_id}/tasks/{task_index}/files/{name:path}")
def task_file(
    evaluation_id: str,
    task_index: int,
    name: str,
    session: ResourceSession,
    state: StateDep,
    store: StoreDep,
    attempt: Annotated[int | None, Query(ge=1, le=100)] = None,
    download: bool = False,
) -> FileResponse:
    found = visible_evaluation(state, session, evaluation_id)
    chosen = _chosen_attempt(state, found, task_index, attempt)
    try:
        path = readmodel.output_file(store, found.id, task_index, chosen, name)
    except ArtifactExpiredError as exc:
        raise PageError(410, "Artifacts expired", str(exc)) from None
    if path is None:
        raise PageError(404, "File not found", f"Task {task_index} saved no file {name!r} in attempt {chosen}.")
    return file_response(path, download=download)


@router.get("/evaluations/{evaluation_id}/tasks/{task_index}/suite/{name:path}")
def suite_file(
    evaluation_id: str,
    task_index: int,
    name: str,
    session: ResourceSession,
    state: StateDep,
    suite: SuiteDep,
    download: bool = False,
) -> FileResponse:
    found = visible_evaluation(state, session, evaluation_id)
    task = suite.tasks.get(task_index) if task_index in found.tasks else None
    path = suite_path(suite, task, "./" + name) if task is not None else None
    if path is None:
        raise PageError(404, "File not found", f"Task {task_index} names no suite file {name!r}.")
    return file_response(path, download=download)


@router.get("/evaluations/{evaluation_id}/tasks/{task_index}/notebook")
def notebook(
    evaluation_id: str,
    task_index: int,
    session: ResourceSession,
    state: StateDep,
    store: StoreDep,
    suite: SuiteDep,
    attempt: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> Response:
    found = visible_evaluation(state, session, evaluation_id)
    chosen = _chosen_attempt(state, found, task_index, attempt)
    try:
        trajectory = store.get_trajectory(found.id, task_index, chosen)
    except ArtifactExpiredError as exc:
        raise PageError(410, "Artifacts expired", str(exc)) from None
    except ArtifactNotFoundError:
        trajectory = None
    if trajectory is None:
        raise PageError(404, "No trajectory", f"Task {task_index} has no trajectory in attempt {chosen} (yet).")
    task = suite.tasks.get(task_index)
    try:
        document = build_notebook(trajectory, task.paper_category if task else None)
    except ImportError:
        raise PageError(501, "Notebooks unavailable", "This gateway lacks nbformat: pip install nbformat.") from None
    name = f"{found.id}-task-{task_index}-attempt-{chosen}.ipynb"
    return Response(
        json.dumps(document, ensure_ascii=False, indent=1),
        media_type="application/x-ipynb+json",
        headers={"Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff"},
    )


MAX_COMPARED = 6


@router.get("/compare")
def compare(
    request: Request,
    session: PageSession,
    state: StateDep,
    suite: SuiteDep,
    ids: Annotated[list[str] | None, Query(max_length=MAX_COMPARED)] = None,
    only_different: bool = False,
) -> HTMLResponse:
    chosen = [i for i in dict.fromkeys(ids or []) if i]
    owner = None if session.key.admin else session.key.id
    context: dict[str, object] = {
        "choices": views.run_rows(state, owner, status=EvaluationStatus.COMPLETED.value, limit=100),
        "chosen": chosen,
        "only_different": only_different,
        "page": None,
    }
    if len(chosen) >= 2:
        evaluations = [visible_evaluation(state, session, i) for i in chosen]
        context["page"] = views.compare_page(state, suite, evaluations)
    return render(request, "compare.html", context)


@router.get("/leaderboard")
def leaderboard(request: Request, session: PageSession, state: StateDep) -> HTMLResponse:
    board = get_leaderboard(session.key, state)
    groups: dict[str, list[object]] = {}
    for row in board:
        groups.setdefault(row.comparable_key, []).append(row)
    categories = sorted({c for row in board for c in row.best.per_category})
    return render(request, "leaderboard.html", {"groups": list(groups.values()), "categories": categories})


@router.get("/static/{name}")
def static(name: str) -> Response:
    """The dashboard's stylesheet and script (written here), and the code colours from the installed Pygments."""
    if name == "code.css":
        return Response(stylesheet(), media_type=STATIC_TYPES[".css"], headers={"Cache-Control": "max-age=3600"})
    path = (STATIC / name).resolve()
    if not path.is_relative_to(STATIC) or not path.is_file() or path.suffix not in STATIC_TYPES:
        return Response("not found", status_code=404, media_type="text/plain")
    return FileResponse(path, media_type=STATIC_TYPES[path.suffix], headers={"Cache-Control": "max-age=3600"})


@router.get("/{unknown:path}")
def not_found(request: Request, sessions: Sessions, unknown: str) -> HTMLResponse:
    """Any other address under the dashboard: a page that says so (registered last, so it matches only what no
    other route does)."""
    request.state.dashboard_session = sessions.resolve(request.cookies.get(COOKIE))
    raise PageError(404, "Page not found", f"The dashboard has no page {BASE}/{unknown}.")


def install_dashboard(app: FastAPI) -> None:
    """Serve the dashboard from ``app`` (its routes, and its errors as pages)."""
    app.include_router(router)
    install_error_pages(app)
