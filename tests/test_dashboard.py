"""The dashboard over HTTP: sign-in and its cookie, who sees what, forms that need their token, hostile model
output shown as text, files answered safely, and every page rendering. Real Redis, the gateway app, the artifact
store on disk (the browser tests are in test_dashboard_browser.py)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from gateway.app import create_app
from gateway.dashboard.access import COOKIE
from gateway.settings import GatewaySettings
from services.lifecycle import TaskLifecycle
from services.live.apikeys import ApiKeyStore
from services.state import StateStore
from services.store import ArtifactStore
from services.verdict import GradingOutcome, JudgeMode, Judgment, JudgmentStatus, Verdict, VerdictStatus
from tests import dashboard_data as data
from tests.factories import make_verdict
from tests.fixtures import ADMIN_KEY, gateway_settings, login_form_token, sign_in


@pytest.fixture()
def settings(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> GatewaySettings:
    return gateway_settings(redis_url, suite_path, tmp_path)


@pytest.fixture()
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path)


def _client(settings: GatewaySettings, key: str | None = None) -> TestClient:
    client = TestClient(create_app(settings), base_url="http://testserver", follow_redirects=False)
    if key is not None:
        client.headers["Authorization"] = f"Bearer {key}"
    return client


@pytest.fixture()
def api(settings: GatewaySettings) -> Iterator[TestClient]:
    with _client(settings, ADMIN_KEY) as client:
        yield client


def test_pages_need_a_session_and_sign_in_sets_a_safe_cookie(settings: GatewaySettings) -> None:
    with _client(settings) as browser:
        page = browser.get("/dashboard/runs")
        assert page.status_code == 303 and page.headers["location"].startswith("/dashboard/login?next=")
        assert browser.get("/dashboard/evaluations/x/events").status_code == 401
        token = login_form_token(browser)
        refused = browser.post("/dashboard/login", data={"key": "pbe-nope", "next": "/dashboard/runs", "csrf": token})
        assert refused.status_code == 401 and "not an active API key" in refused.text
        assert f"{COOKIE}=" not in refused.headers.get("set-cookie", "")
        token = login_form_token(browser)
        signed = browser.post(
            "/dashboard/login", data={"key": ADMIN_KEY, "next": "https://evil.example/x", "csrf": token}
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/dashboard/runs"  # never off-site
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/dashboard" in cookie
        assert ADMIN_KEY not in cookie
        runs = browser.get("/dashboard/runs")
        assert runs.status_code == 200 and "Sign out" in runs.text and ADMIN_KEY not in runs.text
        assert "script-src 'self'" in runs.headers["content-security-policy"]


def test_sign_in_needs_this_sites_sign_in_form(settings: GatewaySettings, redis_client: Redis) -> None:
    """Login CSRF: another site cannot sign a browser in with a key of its choosing."""
    with _client(settings) as browser:
        no_form = browser.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard/runs"})
        assert no_form.status_code == 403 and "Sign-in form expired" in no_form.text
        token = login_form_token(browser)
        forged = browser.post("/dashboard/login", data={"key": ADMIN_KEY, "csrf": token + "x"})
        assert forged.status_code == 403
        elsewhere = browser.post(
            "/dashboard/login", data={"key": ADMIN_KEY, "csrf": token}, headers={"Origin": "https://evil.example"}
        )
        assert elsewhere.status_code == 403
        for refused in (no_form, forged, elsewhere):
            assert f"{COOKIE}=" not in refused.headers.get("set-cookie", "")
        cookie = browser.get("/dashboard/login").headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard/login" in cookie
    assert not list(redis_client.scan_iter("pbe:dashboard:session:*"))  # no session was opened


def test_sign_out_needs_the_token_and_ends_the_session(settings: GatewaySettings, redis_client: Redis) -> None:
    with _client(settings) as browser:
        csrf = sign_in(browser, ADMIN_KEY)
        assert browser.post("/dashboard/logout", data={"csrf": "forged"}).status_code == 403
        assert browser.post("/dashboard/logout", data={"csrf": csrf}).status_code == 303
        browser.cookies.clear()  # the browser forgets; the old token must be dead server-side too
    assert not list(redis_client.scan_iter("pbe:dashboard:session:*"))


def test_a_key_sees_its_own_evaluations_and_another_keys_is_a_404_page(
    settings: GatewaySettings, redis_client: Redis, store: ArtifactStore
) -> None:
    _, alice = ApiKeyStore(redis_client).create("alice")
    _, bob = ApiKeyStore(redis_client).create("bob")
    with _client(settings, alice) as alice_api, _client(settings, bob) as bob_api:
        mine = data.submit(alice_api, [7], "alice-model")
        theirs = data.submit(bob_api, [7], "bob-model")
    data.finish(redis_client, store, theirs, 7, VerdictStatus.PASSED)
    with _client(settings) as browser:
        sign_in(browser, alice)
        runs = browser.get("/dashboard/runs").text
        assert mine["id"] in runs and theirs["id"] not in runs
        for path in (
            f"/dashboard/evaluations/{theirs['id']}",
            f"/dashboard/evaluations/{theirs['id']}/tasks/7",
            f"/dashboard/evaluations/{theirs['id']}/tasks/7/files/sales.png",
            f"/dashboard/evaluations/{theirs['id']}/tasks/7/notebook",
            f"/dashboard/compare?ids={mine['id']}&ids={theirs['id']}",
        ):
            response = browser.get(path)
            assert response.status_code == 404, path
            assert "Evaluation not found" in response.text and "bob-model" not in response.text
    with _client(settings) as admin:
        sign_in(admin, ADMIN_KEY)
        assert theirs["id"] in admin.get("/dashboard/runs").text


def test_cancel_and_retry_are_for_the_owner_with_the_forms_token(
    settings: GatewaySettings, redis_client: Redis, store: ArtifactStore
) -> None:
    keys = ApiKeyStore(redis_client)
    _, owner = keys.create("owner")
    _, admin_two = keys.create("ops", admin=True)
    with _client(settings, owner) as owner_api:
        evaluation = data.submit(owner_api, [7, 16], "m")
    data.finish(redis_client, store, evaluation, 7, VerdictStatus.FAILED)
    state = StateStore(redis_client)
    with _client(settings) as browser:
        csrf = sign_in(browser, owner)
        page = browser.get(f"/dashboard/evaluations/{evaluation['id']}").text
        assert "Retry failed tasks" in page and "Cancel" in page
        forged = browser.post(f"/dashboard/evaluations/{evaluation['id']}/retry", data={"csrf": "x"})
        assert forged.status_code == 403 and state.task_attempt(evaluation["id"], 7) == 1
        other_site = browser.post(
            f"/dashboard/evaluations/{evaluation['id']}/retry",
            data={"csrf": csrf},
            headers={"Origin": "https://evil.example"},
        )
        assert other_site.status_code == 403
        done = browser.post(f"/dashboard/evaluations/{evaluation['id']}/retry", data={"csrf": csrf})
        assert done.status_code == 303 and state.task_attempt(evaluation["id"], 7) == 2
        assert browser.post(f"/dashboard/evaluations/{evaluation['id']}/cancel", data={"csrf": csrf}).status_code == 303
        assert state.cancelled(evaluation["id"])
    with _client(settings) as ops:
        csrf = sign_in(ops, admin_two)
        again = ops.post(f"/dashboard/evaluations/{evaluation['id']}/retry", data={"csrf": csrf})
        assert again.status_code == 409 and "cancelled" in again.text


def test_hostile_model_output_is_shown_as_text_and_files_cannot_run_script(
    settings: GatewaySettings, redis_client: Redis, store: ArtifactStore, api: TestClient
) -> None:
    evaluation = data.submit(api, [7], "m")
    data.finish(redis_client, store, evaluation, 7, VerdictStatus.PASSED, reply=data.HOSTILE, judged=True)
    store.put_output_file(
        evaluation["id"], 7, 1, "evil.svg", b'<svg xmlns="http://www.w3.org/2000/svg"><script/></svg>'
    )
    store.put_output_file(evaluation["id"], 7, 1, "page.html", b"<script>alert(1)</script>")
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        page = browser.get(f"/dashboard/evaluations/{evaluation['id']}/tasks/7")
        assert page.status_code == 200
        assert "<script>window.pwned" not in page.text and "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in page.text
        assert "<b>12</b>" not in page.text and "&lt;b&gt;12&lt;/b&gt;" in page.text  # a CSV cell, escaped
        assert "The chart answers the query." in page.text  # the judge's reasoning
        base = f"/dashboard/evaluations/{evaluation['id']}/tasks/7/files"
        svg = browser.get(f"{base}/evil.svg")
        assert svg.headers["content-type"] == "image/svg+xml" and "sandbox" in svg.headers["content-security-policy"]
        html = browser.get(f"{base}/page.html")
        assert html.headers["content-type"] == "application/octet-stream"
        assert html.headers["content-disposition"].startswith("attachment")
        assert browser.get(f"{base}/../../../../etc/passwd").status_code == 404
        assert browser.get(f"/dashboard/evaluations/{evaluation['id']}/tasks/7/suite/../checks.json").status_code == 404


def test_every_page_renders_with_its_figures(
    settings: GatewaySettings, redis_client: Redis, store: ArtifactStore, api: TestClient
) -> None:
    strong = data.submit(api, [7, 16, 44], "strong", prices={"input_per_million": 1, "output_per_million": 2})
    weak = data.submit(api, [7, 16, 44], "weak")
    for task in (7, 16, 44):
        data.finish(redis_client, store, strong, task, VerdictStatus.PASSED, judged=True)
        data.finish(redis_client, store, weak, task, VerdictStatus.PASSED if task == 7 else VerdictStatus.FAILED)
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        page = browser.get(f"/dashboard/evaluations/{strong['id']}").text
        assert "<svg" in page and "Pass rates of strong" in page and "100.0%" in page
        assert "Judge versus tests" in page and "$0.0099" in page  # 9000 prompt + 450 completion tokens
        assert "3\u2009150 per task on average" in page  # each verdict's 3000 prompt + 150 completion tokens
        filtered = browser.get(f"/dashboard/evaluations/{weak['id']}?verdict=failed").text
        assert "2 of 3" in filtered
        task = browser.get(f"/dashboard/evaluations/{strong['id']}/tasks/7").text
        assert 'src="data:image/png;base64,' in task and "sales.png" in task and "<td>Feb</td>" in task
        assert "ValueError: could not convert string to float" in task and "88 MiB peak" in task
        notebook = browser.get(f"/dashboard/evaluations/{strong['id']}/tasks/7/notebook")
        assert notebook.status_code == 200 and notebook.json()["nbformat"] == 4
        image = browser.get(f"/dashboard/evaluations/{strong['id']}/tasks/7/files/sales.png")
        assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
        compare = browser.get(f"/dashboard/compare?ids={strong['id']}&ids={weak['id']}&only_different=true").text
        assert 'class="differs"' in compare and "not comparable" not in compare
        board = browser.get("/dashboard/leaderboard").text
        assert board.index("strong") < board.index("weak") and "Chart" in board
        assert browser.get("/dashboard/static/dashboard.js").headers["content-type"].startswith("text/javascript")
        assert ".code" in browser.get("/dashboard/static/code.css").text
        assert browser.get("/dashboard/static/../pages.py").status_code == 404


def test_file_links_work_for_any_name_and_the_tasks_inputs_are_shown(
    settings: GatewaySettings, redis_client: Redis, store: ArtifactStore, api: TestClient
) -> None:
    evaluation = data.submit(api, [9, 147], "m")
    data.finish(redis_client, store, evaluation, 9, VerdictStatus.PASSED)
    store.put_output_file(evaluation["id"], 9, 1, "odd #1?.csv", b"a,b\n1,2\n")
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        base = f"/dashboard/evaluations/{evaluation['id']}/tasks"
        page = browser.get(f"{base}/9").text
        link = f"{base}/9/files/odd%20%231%3F.csv?attempt=1"
        assert f'href="{link}"' in page
        assert browser.get(link).content == b"a,b\n1,2\n"
        assert browser.get(f"{base}/9/suite/data/tv.xlsx").headers["content-disposition"].startswith("attachment")
        # The task's Excel input as a table: the first row of the suite's own tv.xlsx, read by our reader.
        inputs = page[page.index("The task's inputs") :]
        assert "<th>super_bowl</th>" in inputs and "<th>network</th>" in inputs
        audio = browser.get(f"{base}/147").text
        assert "No trajectory for this attempt yet." in audio and "save the file to ./output/147.mp3" in audio
        mp3 = f"{base}/147/suite/data/Ghostrifter%20Official%20-%20Serenity.mp3"
        assert f'<audio controls preload="none" src="{mp3}">' in audio
        served = browser.get(mp3)
        assert served.status_code == 200 and served.headers["content-type"] == "audio/mpeg"
        assert served.headers["content-disposition"].startswith("inline")


def test_bad_and_unknown_addresses_are_pages(settings: GatewaySettings, api: TestClient) -> None:
    evaluation = data.submit(api, [7], "m")
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        bad = browser.get(f"/dashboard/evaluations/{evaluation['id']}/tasks/seven")
        assert bad.status_code == 422 and bad.headers["content-type"].startswith("text/html")
        assert "Bad address" in bad.text and "task_index" in bad.text and "Sign out" in bad.text
        assert browser.get(f"/dashboard/evaluations/{evaluation['id']}/tasks/7?attempt=0").status_code == 422
        unknown = browser.get("/dashboard/no/such/page")
        assert unknown.status_code == 404 and "Page not found" in unknown.text and "Sign out" in unknown.text
        assert "script-src 'self'" in unknown.headers["content-security-policy"]
        assert browser.get(f"/dashboard/evaluations/{evaluation['id']}").status_code == 200  # still routed
        assert browser.get("/dashboard/static/dashboard.css").status_code == 200
        assert api.get("/v1/evaluations/nope").headers["content-type"] == "application/problem+json"  # API unchanged


def test_dashboard_requests_count_against_the_keys_rate_like_the_api(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    """Pages, previews and downloads cost a signed-in key what API requests cost: past its rate, 429 with
    Retry-After, and the API and the dashboard share one count."""
    settings = gateway_settings(redis_url, suite_path, tmp_path, RATE_LIMIT_PER_MINUTE=6)
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)  # one page read
        statuses = [browser.get("/dashboard/runs").status_code for _ in range(5)]
        assert statuses == [200] * 5
        over = browser.get("/dashboard/runs")
        assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
        assert "6 requests a minute" in over.text
        api = browser.get("/v1/evaluations", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert api.status_code == 429, "the API shares the key's count with its dashboard"


def test_the_evaluation_page_states_each_rate_with_its_interval(
    settings: GatewaySettings, api: TestClient, redis_client: Redis
) -> None:
    """3 of 10 tasks pass: 30.0% with the t interval [0.0, 64.6] (0.3 + 2.262 x 0.1528, clipped below at 0)."""
    tasks = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    body = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tasks": tasks, "prompt": "gpt"}
    evaluation_id = api.post("/v1/evaluations", json=body).json()["evaluation"]["id"]
    lifecycle = TaskLifecycle(redis_client)
    for index in tasks:
        status = VerdictStatus.PASSED if index in (2, 3, 4) else VerdictStatus.FAILED
        lifecycle.record_verdict(
            Verdict(evaluation_id=evaluation_id, task_index=index, attempt=1, paper_category="Chart", status=status)
        )
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        page = browser.get(f"/dashboard/evaluations/{evaluation_id}")
    assert page.status_code == 200
    assert "30.0% [0.0–64.6] of 10" in page.text


SVG = "{http://www.w3.org/2000/svg}"
"""The namespace of the charts' elements, as ElementTree names them."""


def _chart(page: str) -> ElementTree.Element:
    """The page's rate chart, parsed (the inline SVG in the page's chart box)."""
    start = page.index("<svg", page.index('class="chart-box"'))
    return ElementTree.fromstring(page[start : page.index("</svg>", start) + len("</svg>")])


def _error_bars(chart: ElementTree.Element) -> dict[tuple[str, str], ElementTree.Element]:
    """The chart's error bars by (series, group)."""
    found: dict[tuple[str, str], ElementTree.Element] = {}
    for bar in chart.iter(f"{SVG}g"):
        if bar.get("class") == "error-bar":
            key = (bar.get("data-series", ""), bar.get("data-group", ""))
            assert key not in found, f"two error bars for {key}"
            found[key] = bar
    return found


def _bounds(bar: ElementTree.Element) -> tuple[float, float]:
    return float(bar.get("data-low", "nan")), float(bar.get("data-high", "nan"))


def _known_intervals(statistics: dict[str, Any], grading: str) -> dict[str, tuple[float, float]]:
    """The groups of a rate chart (``all`` and the categories) for which the results' ``statistics`` give
    ``grading`` an interval, with its bounds."""
    rows = {"all": statistics[grading]["all"], **statistics[grading]["per_category"]}
    return {group: (row["ci_low"], row["ci_high"]) for group, row in rows.items() if row["ci_low"] is not None}


def _check_drawn_at_its_bounds(chart: ElementTree.Element, bar: ElementTree.Element, rate: float) -> None:
    """The error bar's line stands on its own bar and runs from its low to its high end, on the scale of that bar
    (whose height is ``rate``, above 0)."""
    series, group = bar.get("data-series"), bar.get("data-group")
    (rect,) = [
        r for r in chart.iter(f"{SVG}rect") if (r.findtext(f"{SVG}title") or "").startswith(f"{series} · {group}: ")
    ]
    x, y, width, height = (float(rect.get(name, "nan")) for name in ("x", "y", "width", "height"))
    assert rate > 0
    per_unit = height / rate
    (line,) = [line for line in bar.iter(f"{SVG}line") if line.get("x1") == line.get("x2")]
    top, bottom = sorted(float(line.get(end, "nan")) for end in ("y1", "y2"))
    low, high = _bounds(bar)
    assert bottom == pytest.approx(y + height - per_unit * low, abs=0.3), (series, group, "low end")
    assert top == pytest.approx(y + height - per_unit * high, abs=0.3), (series, group, "high end")
    assert x < float(line.get("x1", "nan")) < x + width, (series, group, "beside its bar")


def _graded(
    evaluation_id: str,
    index: int,
    category: str,
    status: VerdictStatus,
    fixed: VerdictStatus | None = None,
    judged: JudgmentStatus | None = None,
) -> Verdict:
    """A verdict with the fixed tests' status and the judge's, where given."""
    judgment = None
    if judged is not None:
        judgment = Judgment(mode=JudgeMode.ABSOLUTE, status=judged, judge_model="j", prompt_hash="0" * 64)
    return Verdict(
        evaluation_id=evaluation_id,
        task_index=index,
        attempt=1,
        paper_category=category,
        status=status,
        fixed=GradingOutcome(status=fixed) if fixed is not None else None,
        judgment=judgment,
    )


def test_the_charts_draw_each_known_interval_as_an_error_bar_and_no_other(
    settings: GatewaySettings, api: TestClient, redis_client: Redis
) -> None:
    """Chart: 10 tasks, 5 pass (50.0% [12.3-87.7]), 6 by the fixed tests, 2 by the judge (task 11 unjudged); Text:
    a pass, a fail and an infrastructure error; Math: one task (one task gives no interval); Software: only an
    infrastructure error (nothing decided). Error bars where the results' statistics have an interval, at exactly
    its bounds, and none elsewhere; on the compare page the same for each evaluation's series."""
    passed, failed, broken = VerdictStatus.PASSED, VerdictStatus.FAILED, VerdictStatus.INFRA_ERROR
    yes, no = JudgmentStatus.PASSED, JudgmentStatus.FAILED
    chart_tasks = list(range(2, 12))
    tasks = [*chart_tasks, 12, 13, 14, 15, 16]
    models = ("m-one", "m-two")
    bodies = [
        {"model": {"base_url": "http://127.0.0.1:9/v1", "model": m}, "tasks": tasks, "prompt": "gpt"} for m in models
    ]
    ids = [api.post("/v1/evaluations", json=body).json()["evaluation"]["id"] for body in bodies]
    lifecycle = TaskLifecycle(redis_client)
    for index in chart_tasks:
        judged = None if index == 11 else yes if index <= 3 else no
        one = _graded(
            ids[0], index, "Chart", passed if index <= 6 else failed, passed if index <= 7 else failed, judged
        )
        lifecycle.record_verdict(one)
        lifecycle.record_verdict(_graded(ids[1], index, "Chart", passed if index <= 8 else failed))
    for evaluation_id in ids:
        lifecycle.record_verdict(_graded(evaluation_id, 12, "Text", passed, passed, yes))
        lifecycle.record_verdict(_graded(evaluation_id, 13, "Text", failed, failed, no))
        lifecycle.record_verdict(_graded(evaluation_id, 14, "Text", broken))
        lifecycle.record_verdict(_graded(evaluation_id, 15, "Math", passed, passed, yes))
        lifecycle.record_verdict(_graded(evaluation_id, 16, "Software", broken))
    results = [api.get(f"/v1/evaluations/{i}/results").json() for i in ids]
    statistics, metrics = results[0]["statistics"], results[0]["metrics"]
    expected = {
        (series, group): bounds
        for grading, series in (("original", "original"), ("fixed", "fixed"), ("judge", "LLM judge"))
        for group, bounds in _known_intervals(statistics, grading).items()
    }
    assert set(expected) == {(s, g) for s in ("original", "fixed", "LLM judge") for g in ("all", "Chart", "Text")}
    assert expected[("original", "Chart")] == (0.122974, 0.877026)  # 0.5 -+ 2.2622 x 0.16667
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        page = browser.get(f"/dashboard/evaluations/{ids[0]}").text
        compare = browser.get(f"/dashboard/compare?ids={ids[0]}&ids={ids[1]}").text
    chart = _chart(page)
    bars = _error_bars(chart)
    assert {key: _bounds(bar) for key, bar in bars.items()} == expected  # none for Math and Software
    title = bars[("original", "Chart")].findtext(f"{SVG}title") or ""
    assert "95% CI 12.3–87.7%" in title and "over the 10 tasks decided" in title
    rates = {"original": metrics, "fixed": metrics["fixed"], "LLM judge": metrics["llm"]}
    for (series, group), bar in bars.items():
        rate = rates[series]["pass_rate"] if group == "all" else rates[series]["per_category"][group]["pass_rate"]
        _check_drawn_at_its_bounds(chart, bar, rate)
    compared = _error_bars(_chart(compare))
    assert len(compared) == 6
    for model, evaluation_id, result in zip(models, ids, results, strict=True):
        mine = {
            group: _bounds(bar)
            for (series, group), bar in compared.items()
            if series == f"{model} ({evaluation_id[:8]})"
        }
        assert mine == _known_intervals(result["statistics"], "original")


def test_replayed_turns_are_marked_and_the_model_calls_saved_are_counted(
    settings: GatewaySettings, redis_client: Redis, store: ArtifactStore, api: TestClient
) -> None:
    """A retried session replayed its first turn from the reply cache: its task page marks that turn (and shows no
    model latency for it), the evaluation page counts the call and tokens not paid again."""
    evaluation = data.submit(api, [7], "cached")
    session = data.trajectory(evaluation["id"], 7, turns=2)
    session.turns[0].replayed = True
    store.put_trajectory(session)
    verdict = make_verdict(evaluation["id"], 7, VerdictStatus.PASSED, replayed_turns=1, replayed_tokens=1500)
    store.put_verdict(verdict)
    TaskLifecycle(redis_client).record_verdict(verdict)
    with _client(settings) as browser:
        sign_in(browser, ADMIN_KEY)
        task = browser.get(f"/dashboard/evaluations/{evaluation['id']}/tasks/7").text
        assert task.count('class="replayed"') == 1
        summary = browser.get(f"/dashboard/evaluations/{evaluation['id']}").text
        assert "1 model calls (1\u2009500 tokens) replayed from the reply cache" in summary
