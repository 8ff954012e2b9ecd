"""Evaluations for the dashboard's tests and benchmark, made the way the service makes them: submitted to a real
gateway, then trajectories, produced files and verdicts written through the artifact store and the lifecycle, as
the executor and the grader write them."""

import base64
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from services.lifecycle import TaskLifecycle
from services.store import ArtifactStore
from services.trajectory import Execution, Message, Trajectory, Turn
from services.verdict import CheckResult, GradingOutcome, Verdict, VerdictStatus
from tests.factories import make_judgment, make_png, make_session_info, make_submission, make_trajectory, make_verdict

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
"""Model output that would run in the page if it were not escaped."""


def submit(api: httpx.Client, tasks: list[int], model: str, **extra: Any) -> dict[str, Any]:
    """Submit an evaluation through the REST API (the replay endpoint's shape; nothing runs it)."""
    response = api.post("/v1/evaluations", json=make_submission(tasks, model=model, **extra))
    assert response.status_code == 201, response.text
    evaluation: dict[str, Any] = response.json()["evaluation"]
    return evaluation


def trajectory(evaluation_id: str, task: int, *, turns: int = 2, charts: int = 1, reply: str = "") -> Trajectory:
    """A finished session of ``turns`` turns, each running a cell; the first ``charts`` cells displayed a chart."""
    chart = base64.b64encode(make_png()).decode()
    messages = [
        Message(role="system", content="You are an AI Agent who is proficient in solve complicated task."),
        Message(role="user", content="[INFO]The data is uploaded to ./data/sales.csv"),
        Message(role="user", content=f"Draw the sales of task {task} as a line chart"),
    ]
    recorded = []
    for index in range(turns):
        code = f"import pandas as pd\ndf = pd.read_csv('./data/sales.csv')\nprint(df.shape, {index})"
        text = reply or f"Analyse: step {index + 1}."
        content = f"{text}\n```python\n{code}\n```"
        failed = index == 1
        execution = Execution(
            output=f"(10, 2) {index}\n",
            images=[chart] if index < charts else [],
            error_name="ValueError" if failed else None,
            error_value="could not convert string to float" if failed else None,
            duration_s=0.4 + index,
            cpu_s=0.3,
            peak_memory_mb=88.0,
            telemetry_scope="cgroup",
        )
        messages.append(Message(role="assistant", content=content))
        messages.append(Message(role="user", content=f"[INFO]This is a Code Interpreter Message:\n(10, 2) {index}"))
        recorded.append(
            Turn(
                index=index,
                reply=content,
                code=code,
                execution=execution,
                prompt_tokens=900 + index,
                completion_tokens=60,
                model_latency_s=1.2,
            )
        )
    messages.append(Message(role="assistant", content="Finished: the chart is saved to ./output/sales.png"))
    recorded.append(Turn(index=turns, reply=messages[-1].content, prompt_tokens=1000, completion_tokens=12))
    return make_trajectory(
        evaluation_id,
        task,
        messages=messages,
        turns=recorded,
        wall_s=12.5,
        session=make_session_info(
            sandbox_id=f"sbx{task}",
            sandbox_name=f"pbe-sbx-{task}",
            image="pybench-eval/sandbox:latest",
            ready_s=0.2,
            warm=True,
        ),
    )


def finish(
    redis: Redis,
    store: ArtifactStore,
    evaluation: dict[str, Any],
    task: int,
    status: VerdictStatus,
    *,
    category: str = "Chart",
    turns: int = 2,
    charts: int = 1,
    reply: str = "",
    judged: bool = False,
) -> Verdict:
    """Store the task's session (trajectory, a PNG and a CSV it saved) and record its verdict."""
    store.put_trajectory(trajectory(evaluation["id"], task, turns=turns, charts=charts, reply=reply))
    store.put_output_file(evaluation["id"], task, 1, "sales.png", make_png(colour=(46, 157, 106)))
    store.put_output_file(evaluation["id"], task, 1, "summary.csv", b"month,sales\nJan,10\nFeb,<b>12</b>\n")
    passed = status is VerdictStatus.PASSED
    checks = [CheckResult(kind="file_exists", passed=passed, detail="./output/sales.png")]
    verdict = make_verdict(
        evaluation["id"],
        task,
        status,
        category=category,
        checks=checks,
        reason="" if passed else "file_exists failed: no ./output/sales.png",
        fixed=GradingOutcome(status=status, checks=checks),
        turns=turns + 1,
        prompt_tokens=3000,
        completion_tokens=150,
        judgment=make_judgment(
            passed,
            reason="The chart answers the query." if passed else "No chart was drawn.",
            judge_model="judge-m",
            prompt_hash="0" * 64,
        )
        if judged
        else None,
    )
    store.put_verdict(verdict)
    TaskLifecycle(redis).record_verdict(verdict)
    return verdict


def artifacts_of(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path)
