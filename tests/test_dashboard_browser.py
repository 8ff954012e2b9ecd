"""The dashboard in a real browser: headless Chromium from Debian's packages, driven by selenium, against the
gateway served by uvicorn on loopback with a real Redis. It signs in, watches an evaluation's progress move while
its tasks are graded, opens a task (chart, produced files), compares two evaluations, is refused another key's
evaluation, finds no JavaScript error, and reads every page with JavaScript off. A screenshot of each page is saved
under var/screenshots/ for a person to look at.
"""

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from gateway.app import create_app
from services.live.apikeys import ApiKeyStore
from services.store import ArtifactStore
from services.verdict import VerdictStatus
from tests import dashboard_data as data
from tests.fixtures import ADMIN_KEY, gateway_settings
from tests.servers import serve

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (make install)")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = [pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "var" / "screenshots"


@pytest.fixture(scope="module", autouse=True)
def _browser_present() -> None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("no Chromium here: apt-get install chromium chromium-driver (make test installs them as root)")


@pytest.fixture()
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path)


@pytest.fixture()
def gateway(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[str]:
    with serve(create_app(gateway_settings(redis_url, suite_path, tmp_path))) as url:
        yield url


@pytest.fixture()
def api(gateway: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        yield client


def _driver(javascript: bool = True) -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(flag)
    options.add_argument("--no-proxy-server")
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


@pytest.fixture()
def browser(gateway: str) -> Iterator[Any]:
    driver = _driver()
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _sign_in(driver: Any, gateway: str, key: str, then: str = "/dashboard/runs") -> None:
    driver.get(f"{gateway}{then}")
    assert "/dashboard/login" in driver.current_url  # no session yet: the sign-in form, and back after it
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 10).until(lambda d: then in d.current_url)


def _errors(driver: Any) -> list[dict[str, Any]]:
    """The browser console's errors so far (an aborted event stream on navigation is not one)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _until(driver: Any, condition: Callable[[Any], Any], timeout_s: float = 15) -> Any:
    return WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(condition)


ERROR_BAR = """
const bar = document.querySelector(`g.error-bar[data-series="${arguments[0]}"][data-group="${arguments[1]}"]`);
if (!bar) return null;
const named = `${arguments[0]} · ${arguments[1]}: `;
const rect = [...bar.parentNode.querySelectorAll("rect > title")].find(t => t.textContent.startsWith(named)).parentNode;
const line = [...bar.querySelectorAll("line")].find(l => l.getAttribute("x1") === l.getAttribute("x2"));
const drawn = line.getBoundingClientRect(), under = rect.getBoundingClientRect();
return {low: Number(bar.dataset.low), high: Number(bar.dataset.high), title: bar.querySelector("title").textContent,
        top: drawn.top, bottom: drawn.bottom, x: drawn.left, bar_bottom: under.bottom, bar_height: under.height,
        bar_left: under.left, bar_right: under.right};
"""
"""The error bar of a series in a group of the page's chart, as the browser laid it out (its line's and its bar's
positions on screen), or null."""


def _error_bar(driver: Any, series: str, group: str) -> dict[str, Any]:
    drawn = driver.execute_script(ERROR_BAR, series, group)
    assert drawn is not None, f"no error bar for {series} in {group}"
    return dict(drawn)


def _check_drawn_at_its_bounds(drawn: dict[str, Any], rate: float) -> None:
    """The error bar's line stands on its bar and spans its bounds on that bar's scale (the bar is ``rate`` high)."""
    per_unit = drawn["bar_height"] / rate
    assert drawn["bottom"] == pytest.approx(drawn["bar_bottom"] - per_unit * drawn["low"], abs=1.0)
    assert drawn["top"] == pytest.approx(drawn["bar_bottom"] - per_unit * drawn["high"], abs=1.0)
    assert drawn["bar_left"] < drawn["x"] < drawn["bar_right"]


def test_sign_in_keeps_the_key_out_of_the_browser(browser: Any, gateway: str) -> None:
    browser.get(f"{gateway}/dashboard/login")
    _shot(browser, "login")
    _sign_in(browser, gateway, ADMIN_KEY)
    (cookie,) = browser.get_cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Lax" and ADMIN_KEY not in cookie["value"]
    assert browser.execute_script("return window.localStorage.length + window.sessionStorage.length") == 0
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: no script can read it
    _shot(browser, "runs-empty")
    assert _errors(browser) == []


def test_an_evaluation_page_moves_while_its_tasks_are_graded(
    browser: Any, gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    tasks = [7, 16, 44, 61]
    evaluation = data.submit(api, tasks, "live-model")
    _sign_in(browser, gateway, ADMIN_KEY, then=f"/dashboard/evaluations/{evaluation['id']}")
    bar = browser.find_element(By.CSS_SELECTOR, ".summary progress")
    assert bar.get_attribute("value") == "0"
    for count, task in enumerate(tasks, start=1):
        data.finish(redis_client, store, evaluation, task, VerdictStatus.PASSED, category="Chart")
        _until(browser, lambda d, n=count: d.find_element(By.CSS_SELECTOR, ".summary progress").get_attribute("value")
               == str(n))  # fmt: skip
        if count == 2:
            _shot(browser, "evaluation-running")
    _until(browser, lambda d: d.find_element(By.CSS_SELECTOR, ".summary [data-field=status]").text == "completed")
    assert browser.find_element(By.CSS_SELECTOR, ".summary [data-field=graded]").text == str(len(tasks))
    browser.refresh()
    assert browser.find_element(By.CSS_SELECTOR, ".chart-box svg").is_displayed()
    assert len(browser.find_elements(By.CSS_SELECTOR, "table.tasks tbody tr")) == len(tasks)
    _shot(browser, "evaluation")
    # The runs list follows running evaluations the same way.
    running = data.submit(api, [7], "second-model")
    browser.get(f"{gateway}/dashboard/runs")
    row = f"tr[data-evaluation='{running['id']}']"
    assert browser.find_element(By.CSS_SELECTOR, f"{row} [data-field=done]").text == "0"
    data.finish(redis_client, store, running, 7, VerdictStatus.FAILED)
    _until(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"{row} [data-field=done]").text == "1")
    _shot(browser, "runs")
    assert _errors(browser) == []


def test_a_task_page_shows_the_chart_and_the_produced_files(
    browser: Any, gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    evaluation = data.submit(api, [7], "m")
    data.finish(redis_client, store, evaluation, 7, VerdictStatus.PASSED, turns=3, charts=2, judged=True)
    _sign_in(browser, gateway, ADMIN_KEY, then=f"/dashboard/evaluations/{evaluation['id']}/tasks/7")
    charts = browser.find_elements(By.CSS_SELECTOR, "img.chart-output")
    assert len(charts) == 2
    _until(browser, lambda d: all(d.execute_script("return arguments[0].naturalWidth", i) == 120 for i in charts))
    produced = browser.find_element(By.CSS_SELECTOR, "figure.file.image.output img")
    loaded = "return arguments[0].complete && arguments[0].naturalWidth"
    _until(browser, lambda d: d.execute_script(loaded, produced) == 120)  # served from the store (loading=lazy)
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "figure.file.table.output td")]
    assert cells == ["Jan", "10", "Feb", "<b>12</b>"]  # the CSV as a table, its markup as text
    assert "The chart answers the query." in browser.find_element(By.CSS_SELECTOR, ".judge").text
    assert browser.find_elements(By.CSS_SELECTOR, ".code .kn")  # highlighted: `import` is a keyword span
    _shot(browser, "task")
    assert _errors(browser) == []


def test_a_tasks_inputs_show_excel_as_a_table_and_audio_plays(
    browser: Any, gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    evaluation = data.submit(api, [9, 147], "m")
    _sign_in(browser, gateway, ADMIN_KEY, then=f"/dashboard/evaluations/{evaluation['id']}/tasks/9")
    header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "figure.file.table.input thead th")]
    assert header[:3] == ["super_bowl", "network", "avg_us_viewers"]  # tv.xlsx (and tv.csv, the same columns)
    _shot(browser, "task-inputs")
    browser.get(f"{gateway}/dashboard/evaluations/{evaluation['id']}/tasks/147")
    players = browser.find_elements(By.CSS_SELECTOR, "figure.file.audio.input audio")
    assert len(players) == 2  # Serenity.mp3 and Haze.wav
    for player in players:
        browser.execute_script("arguments[0].preload = 'metadata'; arguments[0].load()", player)
        _until(browser, lambda d, p=player: d.execute_script("return arguments[0].readyState", p) >= 1)
        assert browser.execute_script("return arguments[0].duration", player) > 1  # decoded: seconds of music
        assert browser.execute_script("return arguments[0].error", player) is None
    _shot(browser, "task-audio")
    assert _errors(browser) == []


def test_compare_two_evaluations_task_by_task(
    browser: Any, gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    first = data.submit(api, [7, 16], "model-a")
    second = data.submit(api, [7, 16], "model-b")
    for task in (7, 16):
        data.finish(redis_client, store, first, task, VerdictStatus.PASSED)
        data.finish(redis_client, store, second, task, VerdictStatus.PASSED if task == 7 else VerdictStatus.FAILED)
    _sign_in(browser, gateway, ADMIN_KEY, then="/dashboard/compare")
    for evaluation in (first, second):
        browser.find_element(By.CSS_SELECTOR, f"input[name=ids][value='{evaluation['id']}']").click()
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    _until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "table.compare"))
    differing = browser.find_elements(By.CSS_SELECTOR, "table.compare tr.differs")
    assert [row.find_element(By.TAG_NAME, "td").text for row in differing] == ["16"]
    names = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "table.wins thead th")][1:]
    wins = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "table.wins td")]
    a, b = names.index("model-a"), names.index("model-b")
    assert wins[a * 2 + b] == "1" and wins[b * 2 + a] == "0"  # model-a passes 16, model-b does not
    _shot(browser, "compare")
    browser.get(f"{gateway}/dashboard/leaderboard")
    assert "model-a" in browser.find_element(By.CSS_SELECTOR, "table.board").text
    _shot(browser, "leaderboard")
    assert _errors(browser) == []


def test_another_keys_evaluation_is_not_reachable(
    browser: Any, gateway: str, api: httpx.Client, redis_client: Redis
) -> None:
    hidden = data.submit(api, [7], "admins-model")
    _, bob = ApiKeyStore(redis_client).create("bob")
    _sign_in(browser, gateway, bob)
    browser.get(f"{gateway}/dashboard/evaluations/{hidden['id']}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Evaluation not found"
    assert "admins-model" not in browser.page_source
    _shot(browser, "not-found")
    assert (
        httpx.get(browser.current_url, cookies={c["name"]: c["value"] for c in browser.get_cookies()}).status_code
        == 404
    )


def test_every_page_reads_with_javascript_off(
    gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    evaluation = data.submit(api, [7, 16], "no-script-model")
    data.finish(redis_client, store, evaluation, 7, VerdictStatus.PASSED)
    driver = _driver(javascript=False)
    try:
        _sign_in(driver, gateway, ADMIN_KEY)
        link = driver.find_element(By.LINK_TEXT, evaluation["id"])
        link.click()
        _until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "table.tasks"))
        progress = driver.find_element(By.CSS_SELECTOR, ".summary [data-field=done]").text
        assert progress == "1"  # as of loading; a reload shows newer
        assert driver.find_element(By.LINK_TEXT, "Reload").is_displayed()  # a link in place of the live updates
        _shot(driver, "evaluation-no-javascript")
        driver.find_element(By.LINK_TEXT, "7").click()
        _until(driver, lambda d: "Task 7" in d.find_element(By.TAG_NAME, "h1").text)
        assert driver.find_elements(By.CSS_SELECTOR, "img.chart-output")
        _shot(driver, "task-no-javascript")
        driver.find_element(By.LINK_TEXT, "Leaderboard").click()
        _until(driver, lambda d: "Leaderboard" in d.find_element(By.TAG_NAME, "h1").text)
    except TimeoutException:
        _shot(driver, "failed-no-javascript")
        raise
    finally:
        driver.quit()


def test_the_intervals_and_the_paired_test_read_in_a_browser(
    browser: Any, gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    """Ten tasks: model-a passes all, model-b nine (the evaluation page's interval [67.4, 100], drawn as error bars
    on its chart as the API gives it); the compare page gives the paired test (one discordant task: McNemar p = 1)
    and the leaderboard marks model-b not separable."""
    tasks = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    first, second = data.submit(api, tasks, "model-a"), data.submit(api, tasks, "model-b")
    for task in tasks:
        data.finish(redis_client, store, first, task, VerdictStatus.PASSED, charts=0)
        status = VerdictStatus.FAILED if task == 2 else VerdictStatus.PASSED
        data.finish(redis_client, store, second, task, status, charts=0)
    _sign_in(browser, gateway, ADMIN_KEY, then=f"/dashboard/evaluations/{second['id']}")
    intervals = browser.find_element(By.CSS_SELECTOR, "table.intervals").text
    assert "90.0% [67.4–100.0] of 10" in intervals
    results = api.get(f"/v1/evaluations/{second['id']}/results").json()
    for grading in ("original", "fixed"):  # the judge graded nothing: no LLM judge series
        parts = results["statistics"][grading]
        for group, row in (("all", parts["all"]), ("Chart", parts["per_category"]["Chart"])):
            drawn = _error_bar(browser, grading, group)
            assert (drawn["low"], drawn["high"]) == (row["ci_low"], row["ci_high"])
            assert (drawn["low"], drawn["high"]) == pytest.approx((0.674, 1.0), abs=5e-4)
            assert "95% CI 67.4–100.0%" in drawn["title"]
            _check_drawn_at_its_bounds(drawn, rate=0.9)
    assert not browser.find_elements(By.CSS_SELECTOR, "g.error-bar[data-series='LLM judge']")
    browser.get(f"{gateway}/dashboard/compare?ids={first['id']}&ids={second['id']}")
    compared = _error_bar(browser, f"model-b ({second['id'][:8]})", "all")
    overall = results["statistics"]["original"]["all"]
    assert (compared["low"], compared["high"]) == (overall["ci_low"], overall["ci_high"])
    _check_drawn_at_its_bounds(compared, rate=0.9)
    all_passed = _error_bar(browser, f"model-a ({first['id'][:8]})", "all")
    assert (all_passed["low"], all_passed["high"]) == (1.0, 1.0)  # every task passed: no spread, a flat bar
    paired = browser.find_element(By.CSS_SELECTOR, "table.paired").text
    assert "-10.0 pt" in paired and "mcnemar-exact" in paired and " 1 " in f" {paired} "
    _shot(browser, "compare-paired")
    browser.get(f"{gateway}/dashboard/leaderboard")
    board = browser.find_element(By.CSS_SELECTOR, "table.board").text
    assert "67.4%–100.0%" in board and "not separable (p = 1)" in board
    _shot(browser, "leaderboard-intervals")
    assert _errors(browser) == []
