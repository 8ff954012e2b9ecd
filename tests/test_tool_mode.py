"""The tool-calling mode: the model calls `execute_python` through the OpenAI tools API; a real kernel (the
local backend's gateway) runs the code; the output goes back as a `tool` message. Against a real scripted
server on loopback that checks the request as an OpenAI server would."""

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis import Redis

from executor.agent import EXECUTE_PYTHON_TOOL, run_agent
from executor.calls import SessionModel
from executor.kernel import KernelClient
from services.endpoint.client import EndpointClient
from services.evaluation import Budgets, Evaluation, ModelEndpoint, Prices, Sampling
from services.live.spend import SpendLedger
from services.sandbox.base import SandboxSpec
from services.sandbox.local import LocalSandboxBackend
from services.trajectory import EndReason, Message
from tests.servers import serve


def call(call_id: str, arguments: str, name: str = "execute_python") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class ToolServer:
    """Replies in order; records each request's messages and tools."""

    def __init__(self) -> None:
        self.replies: deque[dict[str, Any]] = deque()
        self.requests: list[dict[str, Any]] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            message = self.replies.popleft()
            choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "tool_calls"}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice]})

        return app


@pytest.fixture()
def server() -> Iterator[tuple[ToolServer, str]]:
    scripted = ToolServer()
    with serve(scripted.app()) as url:
        yield scripted, url + "/v1"


@pytest.fixture()
def kernel(tmp_path: Path) -> Iterator[KernelClient]:
    backend = LocalSandboxBackend(root=tmp_path)
    handle = backend.start(SandboxSpec("tool-mode", 1, 1, image="local"))
    client = KernelClient(handle.url, handle.token, probe_scope=None)
    client.start()
    yield client
    client.close()
    backend.stop(handle)


def test_code_runs_through_execute_python_calls_and_comes_back_as_tool_messages(
    server: tuple[ToolServer, str], kernel: KernelClient
) -> None:
    scripted, url = server
    scripted.replies.extend(
        [
            {"content": None, "tool_calls": [call("c1", json.dumps({"code": "x = 17 * 23\nprint(x)"}))]},
            {"content": "", "tool_calls": [call("c2", "not json"), call("c3", json.dumps({"code": "print(1)"}))]},
            {"content": "", "tool_calls": [call("c4", json.dumps({"code": "print(x + 1)"}))]},
            {"content": "Finished: 17 * 23 = 391"},
        ]
    )
    model = EndpointClient(url, "m", retries=0)
    opening = [Message(role="system", content="s"), Message(role="user", content="compute 17 * 23")]
    run = run_agent(opening, model, kernel, max_turns=10, cell_timeout_s=30, sampling={}, tools=True)
    assert run.end_reason is EndReason.NO_CODE
    assert all(request["tools"] == [EXECUTE_PYTHON_TOOL] for request in scripted.requests)
    roles = [(m.role, m.tool_call_id) for m in run.messages[2:]]
    assert roles == [
        ("assistant", None),
        ("tool", "c1"),
        ("assistant", None),
        ("tool", "c2"),
        ("tool", "c3"),
        ("assistant", None),
        ("tool", "c4"),
        ("assistant", None),
    ]
    assert "391" in run.messages[3].content
    assert "not JSON" in run.messages[5].content and run.messages[6].content == "not run: one call per turn"
    assert "392" in run.messages[8].content  # the kernel kept its state between calls
    assert run.messages[-1].content == "Finished: 17 * 23 = 391"
    # The model saw its own calls and their answers, as OpenAI's API wants them.
    last = scripted.requests[-1]["messages"]
    assert last[2]["tool_calls"][0]["id"] == "c1" and last[3] == {
        "role": "tool",
        "content": run.messages[3].content,
        "tool_call_id": "c1",
    }
    assert [t.code for t in run.turns] == ["x = 17 * 23\nprint(x)", None, "print(x + 1)", None]


def test_pybench_mode_messages_dump_exactly_as_recorded() -> None:
    assert Message(role="user", content="q").model_dump() == {"role": "user", "content": "q"}


def test_malformed_tool_calls_are_answered_with_what_to_fix_and_the_session_goes_on(
    server: tuple[ToolServer, str], kernel: KernelClient
) -> None:
    scripted, url = server
    nested = "[" * 100_000 + "]" * 100_000
    scripted.replies.extend(
        [
            {"content": "", "tool_calls": [{"id": "a", "type": "function", "function": "execute_python"}]},
            {"content": "", "tool_calls": [{"id": 7, "function": {"name": "execute_python", "arguments": {"x": 1}}}]},
            {"content": "", "tool_calls": [{"id": "c", "function": {"name": ["x"], "arguments": "{}"}}]},
            {"content": "", "tool_calls": [call("d", nested)]},
            {"content": "", "tool_calls": [call("e", json.dumps({"code": "print(6 * 7)"}))]},
            {"content": "Finished: 42"},
        ]
    )
    model = EndpointClient(url, "m", retries=0)
    opening = [Message(role="system", content="s"), Message(role="user", content="compute 6 * 7")]
    run = run_agent(opening, model, kernel, max_turns=10, cell_timeout_s=30, sampling={}, tools=True)
    assert run.end_reason is EndReason.NO_CODE and run.error is None
    answers = [m for m in run.messages if m.role == "tool"]
    assert "no function object" in answers[0].content and answers[0].tool_call_id == "a"
    assert "must be a JSON text" in answers[1].content and answers[1].tool_call_id is None  # an id that is no text
    assert "unknown tool" in answers[2].content
    assert "not JSON" in answers[3].content
    assert "42" in answers[4].content and answers[4].tool_call_id == "e"
    assert [t.code for t in run.turns] == [None, None, None, None, "print(6 * 7)", None]


class BudgetServer(ToolServer):
    """Replies with a cell each turn, reporting ``TOKENS`` tokens per reply."""

    TOKENS = (300, 100)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            self.requests.append(await request.json())
            choice = {"index": 0, "message": {"role": "assistant", "content": "```python\nprint(1)\n```"}}
            usage = {"prompt_tokens": self.TOKENS[0], "completion_tokens": self.TOKENS[1], "total_tokens": 400}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice], "usage": usage})

        return app


@pytest.mark.parametrize(
    ("budgets", "reason", "turns"),
    [
        (Budgets(max_tokens_per_task=1000), EndReason.TOKEN_BUDGET, 3),  # 400, 800, 1200 >= 1000: no fourth call
        (Budgets(max_seconds_per_task=0.001), EndReason.TIME_BUDGET, 1),  # past it once the first turn ran
        (Budgets(max_tokens_per_task=10**6, max_seconds_per_task=3600), EndReason.MAX_TURNS, 5),
    ],
)
def test_a_session_past_its_budget_ends_before_its_next_turn_with_its_own_reason(
    kernel: KernelClient, budgets: Budgets, reason: EndReason, turns: int
) -> None:
    scripted = BudgetServer()
    with serve(scripted.app()) as url:
        model = EndpointClient(url + "/v1", "m", retries=0)
        run = run_agent(
            [Message(role="user", content="q")], model, kernel, max_turns=5, cell_timeout_s=30, sampling={},
            budgets=budgets,
        )  # fmt: skip
    assert run.end_reason is reason and not reason.infra
    assert len(run.turns) == turns and len(scripted.requests) == turns, "no model call past the budget"
    if reason is EndReason.TOKEN_BUDGET:
        assert run.error == "the session used 1,200 tokens, its budget of 1,000 per task"


def test_an_evaluation_past_its_cost_limit_stops_every_session_before_its_next_turn(
    kernel: KernelClient, redis_client: Redis
) -> None:
    """At $1000 per million tokens each call of 400 tokens costs $0.40: against a limit of $1 the first session
    makes three calls ($1.20, past it), and the next session of the same evaluation makes none."""
    scripted = BudgetServer()
    budgets = Budgets(max_cost_usd=1.0)
    with serve(scripted.app()) as url:
        evaluation = Evaluation(
            id="priced", model=ModelEndpoint(base_url=url + "/v1", model="m"), suite="pybench", tasks=[1, 2],
            max_turns=5, cell_timeout_s=30, prompt="gpt", sampling=Sampling(), budgets=budgets,
            prices=Prices(input_per_million=1000, output_per_million=1000),
        )  # fmt: skip
        runs = []
        for _ in range(2):
            endpoint = EndpointClient(url + "/v1", "m", retries=0)
            model = SessionModel(endpoint, evaluation, ledger=SpendLedger(redis_client, evaluation.id))
            runs.append(
                run_agent(
                    [Message(role="user", content="q")],
                    model,
                    kernel,
                    max_turns=5,
                    cell_timeout_s=30,
                    sampling={},
                    budgets=budgets,
                    spent_usd=model.spent_usd,
                )  # fmt: skip
            )
            endpoint.close()
    assert [r.end_reason for r in runs] == [EndReason.COST_BUDGET, EndReason.COST_BUDGET]
    assert [len(r.turns) for r in runs] == [3, 0] and len(scripted.requests) == 3
    assert runs[1].error == "the evaluation spent $1.2000 on model calls, its budget of $1.0000"
    assert not EndReason.COST_BUDGET.infra


class SlowBudgetServer(BudgetServer):
    """``BudgetServer``'s replies, each after ``LATENCY_S``."""

    LATENCY_S = 0.4

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            await asyncio.sleep(self.LATENCY_S)
            self.requests.append(await request.json())
            choice = {"index": 0, "message": {"role": "assistant", "content": "```python\nprint(1)\n```"}}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice]})

        return app


def test_the_time_budget_counts_the_model_calls_not_only_the_last_cell(kernel: KernelClient) -> None:
    """Calls of 0.4 s and quick cells against 1 s: past it after the third turn (about 1.2 s), whatever the cells
    took."""
    scripted = SlowBudgetServer()
    with serve(scripted.app()) as url:
        model = EndpointClient(url + "/v1", "m", retries=0)
        run = run_agent(
            [Message(role="user", content="q")], model, kernel, max_turns=8, cell_timeout_s=30, sampling={},
            budgets=Budgets(max_seconds_per_task=1.0),
        )  # fmt: skip
    assert run.end_reason is EndReason.TIME_BUDGET
    assert len(run.turns) == 3 == len(scripted.requests)
