"""Evaluations for the dashboard's tests and benchmark, made the way the service makes them: submitted to a real
gateway, then trajectories, produced files and verdicts written through the artifact store and the lifecycle, as
the executor and the grader write them."""

import base64
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from services.lifecycle import TaskLifecycle
from services.store import ArtifactStore
from services.trajectory import EndReason, Execution, Message, SessionInfo, Trajectory, Turn
from services.verdict import CheckResult, GradingOutcome, JudgeMode, Judgment, JudgmentStatus, Verdict, VerdictStatus

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
"""Model output that would run in the page if it were not escaped."""


def png(width: int = 120, height: int = 80, colour: tuple[int, int, int] = (59, 111, 182)) -> bytes:
    """A PNG image of ``width`` x ``height`` with a diagonal band, made without any imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    rows = b"".join(
        b"\x00"
        + b"".join(bytes(colour) if abs(x - y * width // height) < 12 else b"\xff\xff\xff" for x in range(width))
        for y in range(height)
    )
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def submit(api: httpx.Client, tasks: list[int], model: str, **extra: Any) -> dict[str, Any]:
    """Submit an evaluation through the REST API (the replay endpoint's shape; nothing runs it)."""
    body = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": model}, "tasks": tasks, "prompt": "gpt", **extra}
    response = api.post("/v1/evaluations", json=body)
    assert response.status_code == 201, response.text
    evaluation: dict[str, Any] = response.json()["evaluation"]
    return evaluation


def trajectory(evaluation_id: str, task: int, *, turns: int = 2, charts: int = 1, reply: str = "") -> Trajectory:
    """A finished session of ``turns`` turns, each running a cell; the first ``charts`` cells displayed a chart."""
    chart = base64.b64encode(png()).decode()
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
    return Trajectory(
        evaluation_id=evaluation_id,
        task_index=task,
        attempt=1,
        messages=messages,
        turns=recorded,
        end_reason=EndReason.NO_CODE,
        wall_s=12.5,
        session=SessionInfo(
            sandbox_backend="docker",
            sandbox_id=f"sbx{task}",
            sandbox_name=f"pbe-sbx-{task}",
            image="pybench-eval/sandbox:latest",
            started_at=datetime.now(UTC),
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
    store.put_output_file(evaluation["id"], task, 1, "sales.png", png(colour=(46, 157, 106)))
    store.put_output_file(evaluation["id"], task, 1, "summary.csv", b"month,sales\nJan,10\nFeb,<b>12</b>\n")
    passed = status is VerdictStatus.PASSED
    checks = [CheckResult(kind="file_exists", passed=passed, detail="./output/sales.png")]
    verdict = Verdict(
        evaluation_id=evaluation["id"],
        task_index=task,
        attempt=1,
        paper_category=category,
        status=status,
        checks=checks,
        reason="" if passed else "file_exists failed: no ./output/sales.png",
        fixed=GradingOutcome(status=status, checks=checks),
        turns=turns + 1,
        prompt_tokens=3000,
        completion_tokens=150,
        judgment=Judgment(
            mode=JudgeMode.ABSOLUTE,
            status=JudgmentStatus.PASSED if passed else JudgmentStatus.FAILED,
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
