"""The ``pybench-eval`` command line, in-process, against a real gateway served on loopback with a real Redis,
and a real (tiny) OpenAI-compatible model server for the preflight."""

import base64
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from fastapi import FastAPI, Header
from redis import Redis

from gateway.app import create_app
from gateway.cli import main
from gateway.cli.commands import parse_tasks
from gateway.cli.errors import UsageError
from gateway.cli.printer import Printer, shorten
from gateway.cli.report import REASON_WIDTH
from gateway.cli.watch import watch
from gateway.client import GatewayClient, GatewayError, GatewayUnreachableError
from gateway.notebook import build_notebook, split_reply
from services.lifecycle import TaskLifecycle
from services.live.apikeys import ApiKeyStore
from services.pybench.extraction import extract_code
from services.pybench.recordings import read_recordings
from services.queues import SessionJob
from services.state import StateStore
from services.store import ArtifactStore
from services.trajectory import EndReason, Execution, Message, Turn
from services.verdict import GradingOutcome, VerdictStatus
from tests.factories import make_judgment, make_png, make_submission, make_trajectory, make_verdict
from tests.fixtures import ADMIN_KEY, gateway_settings, test_secrets
from tests.servers import free_port, serve

MODEL = "tiny-model"
MODEL_KEY = "sk-cli-model-canary-51c0"
CATEGORIES = {7: "Chart", 13: "Chart", 77: "Text", 90: "Image&Audio"}
"""Tasks the tests use, by paper category (13's inputs are missing from the suite: it is unavailable)."""


class Run:
    """What one ``main([...])`` call returned and printed."""

    def __init__(self, status: int, out: str, err: str) -> None:
        self.status, self.out, self.err = status, out, err


@pytest.fixture()
def artifacts(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture()
def gateway(redis_url: str, redis_client: Redis, suite_path: Path, artifacts: Path) -> Iterator[str]:
    """A real gateway on loopback (admin key ``ADMIN_KEY``, 127.0.0.1 allowed as a model endpoint)."""
    with serve(create_app(gateway_settings(redis_url, suite_path, artifacts))) as url:
        yield url


@pytest.fixture()
def model_server() -> Iterator[tuple[str, list[str | None]]]:
    """A tiny OpenAI-compatible endpoint that serves ``MODEL``; yields its base URL and the Authorization
    headers it was sent."""
    seen: list[str | None] = []
    app = FastAPI()

    @app.get("/v1/models")
    def models(authorization: str | None = Header(default=None)) -> dict[str, Any]:
        seen.append(authorization)
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "tests"}]}

    with serve(app) as url:
        yield f"{url}/v1", seen


@pytest.fixture()
def cli(gateway: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Run]:
    """Run the CLI in-process against the gateway, as the admin unless ``--key`` says otherwise."""
    monkeypatch.setenv("PBE_GATEWAY_URL", gateway)
    monkeypatch.setenv("PBE_API_KEY", ADMIN_KEY)

    def run(*argv: str) -> Run:
        capsys.readouterr()
        status = main(list(argv))
        captured = capsys.readouterr()
        return Run(status, captured.out, captured.err)

    return run


@pytest.fixture()
def client(gateway: str) -> Iterator[GatewayClient]:
    with GatewayClient(gateway, api_key=ADMIN_KEY) as admin:
        yield admin


def submit(client: GatewayClient, tasks: list[int], model: str = MODEL, **extra: Any) -> str:
    evaluation_id: str = client.submit(make_submission(tasks, model=model, **extra))["evaluation"]["id"]
    return evaluation_id


def assert_one_error_line(run: Run, status: int, needle: str) -> None:
    assert run.status == status, (run.out, run.err)
    assert run.err.startswith("error: ") and run.err.count("\n") == 1, run.err
    assert needle in run.err and "Traceback" not in run.err + run.out


def test_submit_checks_the_model_endpoint_first_and_prints_the_evaluation_id(
    cli: Callable[..., Run],
    model_server: tuple[str, list[str | None]],
    redis_client: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model_url, seen = model_server
    monkeypatch.setenv("TEST_MODEL_KEY", MODEL_KEY)
    argv = ["submit", "--model-url", model_url, "--model", MODEL, "--model-key-env", "TEST_MODEL_KEY"]
    run = cli(*argv, "--tasks", "7,13,77", "--prompt", "gpt", "--max-turns", "3", "--idempotency-key", "k1")
    assert run.status == 0, run.err
    evaluation_id = run.out.strip()
    evaluation = StateStore(redis_client).get(evaluation_id)
    assert evaluation.tasks == [7, 13, 77] and evaluation.max_turns == 3 and evaluation.has_api_key
    assert f"preflight: {model_url} serves {MODEL!r}" in run.err and "1 unavailable here: 13" in run.err
    assert seen == [f"Bearer {MODEL_KEY}"]  # the preflight sent the model's key ...
    assert (
        StateStore(redis_client, test_secrets()).model_key(evaluation_id) == MODEL_KEY
    )  # ... and so did the submission
    assert MODEL_KEY not in run.out + run.err
    again = cli(*argv, "--tasks", "7,13,77", "--prompt", "gpt", "--max-turns", "3", "--idempotency-key", "k1", "--json")
    assert again.status == 0 and json.loads(again.out)["evaluation"]["id"] == evaluation_id


def test_submit_takes_every_field_the_api_takes(
    cli: Callable[..., Run], model_server: tuple[str, list[str | None]], redis_client: Redis
) -> None:
    run = cli(
        "submit", "--model-url", model_server[0], "--model", MODEL, "--tasks", "7", "--suite", "pybench",
        "--mode", "tools", "--cell-timeout", "30", "--temperature", "0.3", "--top-p", "0.9", "--max-tokens", "512",
        "--frequency-penalty", "0.1", "--input-price", "0.5", "--output-price", "1.5", "--no-server-preflight",
        "--max-concurrency", "4", "--judge-url", model_server[0], "--judge-model", MODEL, "--judge-mode", "pairwise",
        "--max-tokens-per-task", "5000", "--max-seconds-per-task", "60", "--max-cost", "2.5", "--reply-cache",
    )  # fmt: skip
    assert run.status == 0, run.err
    evaluation = StateStore(redis_client).get(run.out.strip())
    assert (evaluation.mode, evaluation.cell_timeout_s, evaluation.max_concurrency) == ("tools", 30.0, 4)
    sampling = evaluation.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.frequency_penalty) == (
        0.3,
        0.9,
        512,
        0.1,
    )
    assert evaluation.prices is not None and evaluation.prices.output_per_million == 1.5
    assert evaluation.judge is not None and evaluation.judge.mode == "pairwise"
    assert evaluation.manifest is not None and evaluation.manifest.mode == "tools"
    assert evaluation.budgets is not None and evaluation.reply_cache
    assert evaluation.budgets.model_dump() == {
        "max_tokens_per_task": 5000,
        "max_seconds_per_task": 60.0,
        "max_cost_usd": 2.5,
    }
    unpriced = cli("submit", "--model-url", model_server[0], "--model", MODEL, "--max-cost", "1")
    assert_one_error_line(unpriced, 2, "--max-cost needs --input-price and --output-price")
    half = cli("submit", "--model-url", model_server[0], "--model", MODEL, "--input-price", "1")
    assert_one_error_line(half, 2, "a cost needs both --input-price and --output-price")


def test_preflight_refuses_a_model_the_endpoint_does_not_serve_and_lists_what_it_serves(
    cli: Callable[..., Run], model_server: tuple[str, list[str | None]], redis_client: Redis
) -> None:
    run = cli("submit", "--model-url", model_server[0], "--model", "gpt-7", "--tasks", "7")
    assert_one_error_line(run, 1, f"does not serve 'gpt-7'; it serves: {MODEL}")
    assert StateStore(redis_client).evaluation_ids(None, limit=10) == []


def test_preflight_names_an_unreachable_endpoint_and_can_be_skipped(
    cli: Callable[..., Run], redis_client: Redis
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    run = cli("submit", "--model-url", closed, "--model", MODEL, "--tasks", "7")
    assert_one_error_line(run, 1, "the model endpoint is unreachable")
    assert "--no-preflight" in run.err
    assert StateStore(redis_client).evaluation_ids(None, limit=10) == []
    skipped = cli("submit", "--model-url", closed, "--model", MODEL, "--tasks", "7", "--no-preflight")
    assert skipped.status == 0 and StateStore(redis_client).get(skipped.out.strip()).tasks == [7]


def test_submit_refuses_a_key_variable_that_is_not_set_and_a_bad_task_list(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_UNSET_KEY", raising=False)
    base = ["submit", "--model-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--no-preflight"]
    assert_one_error_line(cli(*base, "--model-key-env", "TEST_UNSET_KEY"), 2, "TEST_UNSET_KEY, which is not set")
    assert_one_error_line(cli(*base, "--tasks", "7,x"), 2, "'x' is neither a task index nor a range")
    assert_one_error_line(cli(*base, "--tasks", "100000"), 1, "HTTP 422")
    assert_one_error_line(cli(*base, "--judge-url", "http://127.0.0.1:9/v1"), 2, "--judge-model")


def test_parse_tasks() -> None:
    assert parse_tasks("1,2,5-9") == [1, 2, 5, 6, 7, 8, 9]
    assert parse_tasks(" 9, 3-3,3 ,") == [3, 9]
    for bad in ("", "a", "5-", "9-5", "-3"):
        with pytest.raises(UsageError):
            parse_tasks(bad)


def test_list_filters_by_model_and_status(cli: Callable[..., Run], client: GatewayClient) -> None:
    first = submit(client, [7])
    other = submit(client, [7], model="other-model")
    run = cli("list")
    assert run.status == 0 and first in run.out and other in run.out
    assert run.out.index(other) < run.out.index(first)  # newest first
    only = cli("list", "--model", "other-model", "--json")
    assert [v["evaluation"]["id"] for v in json.loads(only.out)] == [other]
    assert json.loads(cli("list", "--status", "completed", "--json").out) == []
    assert "no evaluations" in cli("list", "--status", "completed").out
    assert len(json.loads(cli("--json", "list", "--limit", "1").out)) == 1


def test_results_show_pass_rates_per_category_and_every_task(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis
) -> None:
    judge = {"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "judge"}}
    evaluation_id = submit(client, [7, 13, 77, 90], judge=judge)
    lifecycle = TaskLifecycle(redis_client)
    passed_fixed = GradingOutcome(status=VerdictStatus.PASSED)
    lifecycle.record_verdict(
        make_verdict(evaluation_id, 7, VerdictStatus.PASSED, turns=3, fixed=passed_fixed, judgment=make_judgment(True))
    )
    long_reason = "the output file ./output/77.txt does not contain the expected summary " * 3
    lifecycle.record_verdict(
        make_verdict(
            evaluation_id,
            77,
            VerdictStatus.FAILED,
            category=CATEGORIES[77],
            turns=5,
            reason=long_reason,
            fixed=passed_fixed,
            judgment=make_judgment(False),
        )
    )
    lifecycle.start(SessionJob(evaluation_id=evaluation_id, task_index=90))
    run = cli("results", evaluation_id)
    assert run.status == 0, run.err
    lines = run.out.splitlines()
    assert f"evaluation {evaluation_id} · model {MODEL} · running · 3 of 4 tasks graded" in lines[0]
    header = next(line for line in lines if line.startswith("category"))
    assert header.split() == ["category", "tasks", "original", "original", "gradable", "fixed", "fixed"] + [
        "gradable",
        "LLM",
        "LLM",
        "gradable",
    ]
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in ("Chart", "Text")}
    # Chart: 7 passed, 13 unavailable -> 1/2 over all, 1/1 over the gradable.
    assert rows["Chart"][1:6] == ["2", "1/2", "50.0%", "1/1", "100.0%"]
    # Text: 77 failed the original tests, passed the fixed ones, failed the judge.
    assert rows["Text"][1:] == ["1", "0/1", "0.0%", "0/1", "0.0%", "1/1", "100.0%", "1/1", "100.0%"] + [
        "0/1",
        "0.0%",
        "0/1",
        "0.0%",
    ]
    all_row = next(line.split() for line in lines if line.startswith("all "))
    assert all_row[1:4] == ["3", "1/3", "33.3%"]
    assert lines[1] == "passed: original 1/3 33.3%, fixed 2/3 66.7%, LLM 1/3 33.3%"
    assert "disagreeing: 77" in run.out
    tasks = {line.split()[0]: line for line in lines[lines.index("Tasks") :] if line.lstrip()[:1].isdigit()}
    assert tasks["7"].split()[:6] == ["7", "Chart", "passed", "passed", "passed", "3"]
    assert tasks["13"].split()[:6] == ["13", "Chart", "unavailable", "-", "-", "-"]
    assert tasks["90"].split()[:3] == ["90", "Image&Audio", "running"]
    assert tasks["77"].endswith(shorten(long_reason, REASON_WIDTH)) and tasks["77"].endswith("…")
    raw = json.loads(cli("results", evaluation_id, "--json").out)
    assert raw["metrics"]["llm"]["passed"] == 1 and len(raw["verdicts"]) == 3


def test_watch_follows_a_run_until_its_end_with_plain_lines_when_not_a_terminal(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis
) -> None:
    evaluation_id = submit(client, [7, 13, 77, 90])
    lifecycle = TaskLifecycle(redis_client)

    def run_the_tasks() -> None:
        for index, status in ((7, VerdictStatus.PASSED), (77, VerdictStatus.FAILED), (90, VerdictStatus.PASSED)):
            time.sleep(0.4)
            lifecycle.start(SessionJob(evaluation_id=evaluation_id, task_index=index))
            time.sleep(0.6)
            lifecycle.record_verdict(make_verdict(evaluation_id, index, status, category=CATEGORIES[index], turns=2))

    worker = threading.Thread(target=run_the_tasks)
    worker.start()
    try:
        run = cli("watch", evaluation_id)
    finally:
        worker.join()
    assert run.status == 0, run.err
    lines = run.out.splitlines()
    assert lines[0] == (f"watching evaluation {evaluation_id} of {MODEL}: 4 tasks (Chart 2, Text 1, Image&Audio 1)")
    events = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    assert events[0] == "queued: queued 3, unavailable 1 (1/4 finished)"
    assert "task 13 Chart: unavailable; Chart 1/2 done, 0 passed" in events
    assert "running: queued 2, running 1, unavailable 1 (1/4 finished)" in events
    assert "task 7 Chart: passed, 2 turns; Chart 2/2 done, 1 passed" in events
    assert "task 77 Text: failed, 2 turns; Text 1/1 done, 0 passed" in events
    assert "task 90 Image&Audio: passed, 2 turns; Image&Audio 1/1 done, 1 passed" in events
    assert "completed: done 3, unavailable 1 (4/4 finished)" in events
    assert f"evaluation {evaluation_id} completed; passed: original 2/4 50.0%, fixed 2/4 50.0%" in run.out
    assert any(line.split()[:4] == ["all", "4", "2/4", "50.0%"] for line in lines)


def test_watch_draws_bars_per_category_on_a_terminal(client: GatewayClient, redis_client: Redis) -> None:
    evaluation_id = submit(client, [7, 77])
    lifecycle = TaskLifecycle(redis_client)
    lifecycle.record_verdict(make_verdict(evaluation_id, 7, VerdictStatus.PASSED))
    lifecycle.record_verdict(make_verdict(evaluation_id, 77, VerdictStatus.FAILED, category=CATEGORIES[77]))
    out = io.StringIO()
    results = watch(client, evaluation_id, Printer(out, styled=True))
    assert results.complete and results.metrics.passed == 1
    text = out.getvalue()
    assert "\x1b[" in text  # drawn for a terminal
    assert "Chart" in text and "1/1" in text and "passed 1" in text and "passed 0" in text
    assert "completed: done 2 (2/2 finished)" in text


def test_submit_can_watch_and_watch_can_print_json_lines(cli: Callable[..., Run]) -> None:
    # Task 13 is unavailable: the evaluation is finished as soon as it is made.
    base = ["submit", "--model-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--no-preflight", "--tasks", "13"]
    run = cli(*base, "--watch")
    assert run.status == 0, run.err
    evaluation_id, watching, *rest = run.out.splitlines()
    assert watching == f"watching evaluation {evaluation_id} of {MODEL}: 1 tasks (Chart 1)"
    assert f"evaluation {evaluation_id} completed; passed: original 0/1 0.0%, fixed 0/1 0.0%" in rest
    lines = cli("watch", evaluation_id, "--json").out.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["progress", "verdict", "end"]
    assert events[1]["data"]["status"] == "unavailable" and events[2]["data"] == {
        "status": "completed",
        "statuses": {evaluation_id: "completed"},
    }


class _DroppingStream(httpx.SyncByteStream):
    """Sends ``chunks`` then fails as a dropped connection does."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("connection reset by peer")


def test_the_event_stream_is_opened_again_when_it_drops_or_ends_early() -> None:
    progress = b'event: progress\ndata: {"status": "running", "total": 1}\n\n'
    answers: list[Callable[[], httpx.Response]] = [
        lambda: httpx.Response(200, content=progress + b": still running\n\n"),  # ends without `end`
        lambda: httpx.Response(200, stream=_DroppingStream([progress, b"event: verdict\ndata: {"])),
        lambda: httpx.Response(503, json={"detail": "Redis unavailable"}),
        lambda: httpx.Response(
            200, content=progress + b'event: verdict\ndata: {"task_index": 7}\n\nevent: end\ndata: {"status": "x"}\n\n'
        ),
    ]
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return answers[len(requests) - 1]()

    with GatewayClient("http://gateway.test", api_key="k", transport=httpx.MockTransport(handler)) as client:
        events = list(client.events("e1", reconnect_s=0.001))
    assert len(requests) == 4 and all(r.url.path == "/v1/evaluations/e1/events" for r in requests)
    assert [name for name, _ in events] == ["progress", "progress", "progress", "verdict", "end"]
    assert events[3][1] == {"task_index": 7} and events[4][1] == {"status": "x"}


def test_the_event_stream_gives_up_after_failures_in_a_row_and_never_retries_a_refusal() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "no evaluation 'e1'"})

    with (
        GatewayClient("http://gateway.test", transport=httpx.MockTransport(refused)) as client,
        pytest.raises(GatewayError) as error,
    ):
        next(client.events("e1"))
    assert error.value.status == 404 and error.value.detail == "no evaluation 'e1'"
    calls = 0

    def down(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused")

    with (
        GatewayClient("http://gateway.test", transport=httpx.MockTransport(down)) as client,
        pytest.raises(GatewayUnreachableError, match="failed 3 times in a row"),
    ):
        list(client.events("e1", reconnect_s=0.001, max_reconnects=2))
    assert calls == 3


def test_cancel_and_retry(cli: Callable[..., Run], client: GatewayClient, redis_client: Redis) -> None:
    evaluation_id = submit(client, [7, 13, 77])
    run = cli("cancel", evaluation_id)
    assert run.status == 0
    assert (
        run.out.strip()
        == f"evaluation {evaluation_id}: cancelled; 2 queued tasks cancelled, 0 running ones stop at their next "
        "turn, 0 finished ones are graded"
    )
    assert StateStore(redis_client).cancelled(evaluation_id)
    assert_one_error_line(cli("retry", evaluation_id), 1, "HTTP 409: a cancelled evaluation is not run again")
    second = submit(client, [7, 77])
    TaskLifecycle(redis_client).record_verdict(make_verdict(second, 7, VerdictStatus.INFRA_ERROR))
    assert_one_error_line(cli("retry", second, "--tasks", "77"), 1, "retry only tasks in: [7]")
    retried = cli("retry", second, "--tasks", "7")
    assert retried.status == 0 and "2 tasks queued" in retried.out
    assert StateStore(redis_client).task_attempt(second, 7) == 2
    assert_one_error_line(cli("cancel", "nosuch"), 1, "HTTP 404: no evaluation 'nosuch'")


def test_send_keys_gives_a_lost_key_back_without_printing_it(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    evaluation_id = submit(client, [7], api_key=MODEL_KEY)
    redis_client.delete(f"pbe:secret:model-key:{evaluation_id}")
    assert_one_error_line(cli("send-keys", evaluation_id), 2, "needs --model-key-env VAR, --judge-key-env VAR")
    assert_one_error_line(cli("send-keys", evaluation_id, "--model-key-env", "PBE_NO_SUCH_VAR"), 2, "not set")
    monkeypatch.setenv("MY_MODEL_KEY", MODEL_KEY)
    run = cli("send-keys", evaluation_id, "--model-key-env", "MY_MODEL_KEY")
    assert run.status == 0 and "model key held again" in run.out and MODEL_KEY not in run.out + run.err
    assert StateStore(redis_client, test_secrets()).model_key(evaluation_id) == MODEL_KEY
    refused = cli("send-keys", evaluation_id, "--judge-key-env", "MY_MODEL_KEY")
    assert_one_error_line(refused, 1, "HTTP 409: this evaluation was submitted without a judge API key")
    assert MODEL_KEY not in refused.err


def test_the_leaderboard_lists_completed_evaluations(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis
) -> None:
    evaluation_id = submit(client, [7])
    TaskLifecycle(redis_client).record_verdict(make_verdict(evaluation_id, 7, VerdictStatus.PASSED))
    run = cli("leaderboard")
    assert run.status == 0
    (row,) = [line.split() for line in run.out.splitlines() if line.startswith("1 ")]
    assert row[:4] == ["1", MODEL, "1", "100.0%"] and evaluation_id in row
    assert json.loads(cli("leaderboard", "--json").out)[0]["best"]["evaluation_id"] == evaluation_id


def _png() -> str:
    """A 1x1 red PNG, base64."""
    return base64.b64encode(make_png(1, 1, (255, 0, 0))).decode()


def _opening(query: str) -> list[Message]:
    return [
        Message(role="system", content="You are an AI Agent ..."),
        Message(role="user", content="[INFO]The data is uploaded to ./data/x.csv"),
        Message(role="user", content=query),
    ]


def test_export_writes_results_a_pybench_trajectory_file_notebooks_and_saved_files(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis, artifacts: Path, tmp_path: Path
) -> None:
    evaluation_id = submit(client, [7, 13, 77])
    store = ArtifactStore(artifacts)
    code = "import pandas as pd\nprint(pd.__version__)"
    reply = f"Analyse: read the data.\nAction:\n```python\n{code}\n```"
    store.put_trajectory(  # with turns: their code, output, error and image make the cells' outputs
        make_trajectory(
            evaluation_id,
            7,
            messages=[
                *_opening("Analyse the distribution of citations"),
                Message(role="assistant", content=reply),
                Message(role="user", content="[INFO]This is a Code Interpreter Message:\n2.2.2"),
                Message(role="assistant", content="Finished: the outliers are rows 3 and 9."),
            ],
            turns=[
                Turn(index=0, reply=reply, code=code, execution=Execution(output="2.2.2\n", images=[_png()])),
                Turn(index=1, reply="Finished: the outliers are rows 3 and 9."),
            ],
        )
    )
    broken = "<|execute_start|>\n```python\n1/0\n```\n<|execute_end|>"
    store.put_trajectory(  # without turns: the code comes from the fence, the output from the next message
        make_trajectory(
            evaluation_id,
            77,
            messages=[
                *_opening("读一下这篇小说"),
                Message(role="assistant", content=broken),
                Message(role="user", content="[INFO]This is a Code Interpreter Message:\nError: ZeroDivisionError"),
            ],
            end_reason=EndReason.MAX_TURNS,
        )
    )
    store.put_output_file(evaluation_id, 7, 1, "plots/7.png", b"png bytes")
    store.put_output_file(evaluation_id, 7, 1, "game/", b"")  # a folder the session left empty
    TaskLifecycle(redis_client).record_verdict(make_verdict(evaluation_id, 7, VerdictStatus.PASSED))
    out = tmp_path / "export"
    run = cli("export", evaluation_id, "--out", str(out), "--notebooks", "--files")
    assert run.status == 0, run.err
    assert "no trajectory (yet) for tasks 13" in run.err
    assert f"wrote {out / 'trajectory.jsonl'} (2 tasks)" in run.out
    results = json.loads((out / "results.json").read_text())
    assert results["evaluation_id"] == evaluation_id and results["verdicts"][0]["task_index"] == 7
    records = [json.loads(line) for line in (out / "trajectory.jsonl").read_text().splitlines()]
    assert [(r["index"], r["user"]) for r in records] == [
        ("7", "Analyse the distribution of citations"),
        ("77", "读一下这篇小说"),
    ]
    assert records[0]["category1"] == "简单数据分析处理（pandas）"
    assert records[0]["messages"][3] == {"role": "assistant", "content": reply} and len(records[1]["messages"]) == 5
    assert (out / "files" / "7" / "plots" / "7.png").read_bytes() == b"png bytes"
    assert (out / "files" / "7" / "game").is_dir() and not any((out / "files" / "7" / "game").iterdir())

    notebook = nbformat.read(out / "notebooks" / "7.ipynb", as_version=4)
    nbformat.validate(notebook)
    (cell,) = [c for c in notebook.cells if c.cell_type == "code"]
    assert cell.source == code
    assert [o.output_type for o in cell.outputs] == ["stream", "display_data"]
    assert cell.outputs[0].text == "2.2.2\n" and cell.outputs[1].data["image/png"] == _png()
    markdown = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    assert markdown[0].startswith("# Task 7 (Chart)")
    assert "**User:**\n\nAnalyse the distribution of citations" in markdown
    assert "**Assistant** (turn 1):\n\nAnalyse: read the data.\nAction:" in markdown
    assert not any("Interpreter" in m for m in markdown)  # shown as the cell's output instead
    assert notebook.metadata["pybench_eval"]["system_prompt"] == "You are an AI Agent ..."

    other = nbformat.read(out / "notebooks" / "77.ipynb", as_version=4)
    nbformat.validate(other)
    (cell,) = [c for c in other.cells if c.cell_type == "code"]
    assert cell.source == "1/0" and cell.outputs[0].text == "Error: ZeroDivisionError"


@pytest.mark.parametrize(
    ("reply", "prose", "code"),
    [
        ("Plan\n```python\nx = 1\n```\nthen", "Plan\n\nthen", "x = 1"),
        ("<|execute_start|>\n```python\nx = 1\n```\n<|execute_end|>", "", "x = 1"),
        ("<|execute_start|>\nx = 2\n<|execute_end|>", "", "x = 2"),
        ("<|execute_start|>\n```\nx = 3\n```\n<|execute_end|>", "", "x = 3"),
        ("Finished: 42", "Finished: 42", None),
    ],
)
def test_a_reply_splits_into_prose_and_the_code_of_its_first_cell(reply: str, prose: str, code: str | None) -> None:
    assert split_reply(reply) == (prose, code)


AWKWARD_REPLY = (
    "Draft:\n```python\nprint('draft')\n```\nRun this instead:\n"
    "<|execute_start|>\n```\nprint('run')\n```\n<|execute_end|>\nthen check."
)
"""A python fence before an execute-marked bare fence: the agent loop runs the marked cell, not the draft."""


def test_the_notebook_shows_the_code_the_agent_loop_extracts(suite_path: Path) -> None:
    recorded = {r.index: r for r in read_recordings(suite_path / "trajectory.jsonl")}
    trajectories = [
        make_trajectory("e1", index, messages=[Message.model_validate(m) for m in recorded[index].messages])
        for index in (7, 44, 77, 126)  # 126's first reply holds two python fences
    ]
    trajectories.append(
        make_trajectory(
            "e1",
            1,
            messages=[*_opening("q"), Message(role="assistant", content=AWKWARD_REPLY)],
            end_reason=EndReason.MAX_TURNS,
        )
    )
    for trajectory in trajectories:
        notebook = build_notebook(trajectory)
        nbformat.validate(notebook)
        replies = [m.content for m in trajectory.messages if m.role == "assistant"]
        expected = [code for code in map(extract_code, replies) if code is not None]
        assert expected and [c.source for c in notebook.cells if c.cell_type == "code"] == expected
    assert recorded[126].replies[0].count("```python") == 2
    assert split_reply(AWKWARD_REPLY) == (
        "Draft:\n```python\nprint('draft')\n```\nRun this instead:\n\nthen check.",
        "print('run')",
    )


def test_no_output_ever_shows_the_api_key(
    cli: Callable[..., Run],
    gateway: str,
    redis_client: Redis,
    model_server: tuple[str, list[str | None]],
    tmp_path: Path,
) -> None:
    _, plain = ApiKeyStore(redis_client).create("dana")
    secret = plain.rsplit("_", 1)[-1]
    runs = [cli("--key", plain, "submit", "--model-url", model_server[0], "--model", MODEL, "--tasks", "7,77")]
    evaluation_id = runs[0].out.strip()
    TaskLifecycle(redis_client).record_verdict(make_verdict(evaluation_id, 7, VerdictStatus.PASSED))
    for argv in (
        ["list"],
        ["list", "--json"],
        ["results", evaluation_id],
        ["results", evaluation_id, "--json"],
        ["leaderboard"],
        ["export", evaluation_id, "--out", str(tmp_path / "x")],
        ["cancel", evaluation_id],
        ["watch", evaluation_id],
        ["results", "nosuch"],
        ["--gateway", f"http://127.0.0.1:{free_port()}", "list"],
        ["--help"],
    ):
        runs.append(cli("--key", plain, *argv))
    assert [r.status for r in runs] == [0] * 9 + [1, 1, 0]
    for run in runs:
        assert secret not in run.out + run.err and plain not in run.out + run.err
    assert all(secret not in p.read_text() for p in (tmp_path / "x").rglob("*") if p.is_file())


def test_a_missing_or_wrong_key_says_to_set_pbe_api_key(
    cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "pbe_000000000000_" + "x" * 43
    run = cli("--key", wrong, "list")
    assert_one_error_line(run, 1, "HTTP 401: the API key is unknown, malformed or revoked")
    assert "set PBE_API_KEY" in run.err and wrong not in run.err
    monkeypatch.delenv("PBE_API_KEY")
    run = cli("list")
    assert_one_error_line(run, 1, "no API key: set PBE_API_KEY (or pass --key)")


def test_an_unreachable_gateway_is_one_line(cli: Callable[..., Run]) -> None:
    run = cli("--gateway", f"http://127.0.0.1:{free_port()}", "results", "e1")
    assert_one_error_line(run, 1, "cannot reach the gateway at http://127.0.0.1:")
    assert "check --gateway or PBE_GATEWAY_URL" in run.err


def test_keys_are_made_listed_and_revoked_server_side(
    cli: Callable[..., Run], redis_url: str, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PBE_REDIS_URL", redis_url)
    made = cli("keys", "create", "--name", "ci-bot")
    assert made.status == 0 and made.out.startswith("pbe_")
    key_id = made.out.split("_")[1]
    assert ApiKeyStore(redis_client).authenticate(made.out.strip()) is not None
    listed = cli("keys", "list")
    assert f"{key_id}  active" in listed.out and "ci-bot" in listed.out
    assert cli("keys", "revoke", key_id).status == 0
    assert "revoked" in cli("keys", "list").out
    assert cli("keys", "revoke", "nosuch").status == 1
    assert_one_error_line(cli("keys"), 2, "keys needs a command")


def test_compare_prints_the_paired_difference_and_results_print_the_intervals(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis
) -> None:
    tasks = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    a, b = submit(client, tasks), submit(client, tasks)
    lifecycle = TaskLifecycle(redis_client)
    for index in tasks:  # A passes task 2 only; B every other task: discordant 1 and 9, p = 22/1024
        for evaluation_id, passed in ((a, index == 2), (b, index != 2)):
            status = VerdictStatus.PASSED if passed else VerdictStatus.FAILED
            lifecycle.record_verdict(make_verdict(evaluation_id, index, status))
    run = cli("compare", a, b)
    assert run.status == 0, run.err
    (overall,) = [line for line in run.out.splitlines() if line.split()[:2] == ["original", "all"]]
    assert "80.0" in overall and "0.02148" in overall and "mcnemar-exact" in overall
    shown = cli("results", b)
    assert shown.status == 0 and "original: 90.0% [" in shown.out and "over 10 tasks" in shown.out
    assert cli("compare", a, a).status != 0


def test_submit_with_epochs_and_a_seed_and_the_runs_statistics(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis
) -> None:
    argv = ["submit", "--model-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--no-preflight"]
    made = cli(*argv, "--no-server-preflight", "--tasks", "2,3", "--prompt", "gpt", "--epochs", "2", "--seed", "7")
    assert made.status == 0, made.err
    run = client.epochs(made.out.strip())
    assert [e["seed"] for e in run["epochs"]] == [7, 8]
    lifecycle = TaskLifecycle(redis_client)
    for epoch in run["epochs"]:  # task 2 passes in both epochs, task 3 in the second only
        for index, passed in ((2, True), (3, epoch["epoch"] == 2)):
            status = VerdictStatus.PASSED if passed else VerdictStatus.FAILED
            lifecycle.record_verdict(make_verdict(epoch["evaluation_id"], index, status))
    shown = cli("epochs", made.out.strip())
    assert shown.status == 0, shown.err
    assert "original: 75.0%" in shown.out and "pass@2 100.0%" in shown.out and "pass^2 50.0%" in shown.out


def test_regrade_asks_for_another_grading_and_refuses_half_a_judge(
    cli: Callable[..., Run], client: GatewayClient, redis_client: Redis
) -> None:
    evaluation_id = submit(client, [7])
    TaskLifecycle(redis_client).record_verdict(make_verdict(evaluation_id, 7, VerdictStatus.PASSED))
    run = cli("regrade", evaluation_id)
    assert run.status == 0 and "grading 2 under way (1 tasks)" in run.out, run.err
    assert client.evaluation(evaluation_id)["evaluation"]["grading"] == 2
    assert cli("regrade", evaluation_id, "--judge-url", "http://127.0.0.1:9/v1").status == 2
