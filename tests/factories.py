"""Builders of the records tests make again and again: a submission's body, an evaluation, a session's trajectory
and where it ran, a verdict and its judgment, a PNG. Each takes what differs between tests as keyword arguments
and fills in the rest with values no test depends on; nothing here writes to Redis or the artifact store."""

import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from services.evaluation import Evaluation, ModelEndpoint, Sampling
from services.pybench.suite import Suite
from services.trajectory import EndReason, Message, SessionInfo, Trajectory
from services.verdict import JudgeMode, Judgment, JudgmentStatus, Verdict, VerdictStatus

NOWHERE = "http://127.0.0.1:9/v1"
"""A model endpoint nothing listens on (port 9, loopback): for evaluations whose model is never called."""


def make_submission(tasks: Sequence[int] | None = None, *, model: str = "m", **fields: Any) -> dict[str, Any]:
    """The JSON body of ``POST /v1/evaluations``: model ``model`` at ``NOWHERE``, the ``gpt`` prompt, ``tasks``
    (every task of the suite when None); ``fields`` add to it or replace any of it by name."""
    body: dict[str, Any] = {"model": {"base_url": NOWHERE, "model": model}, "prompt": "gpt"}
    if tasks is not None:
        body["tasks"] = list(tasks)
    return body | fields


def make_evaluation(
    evaluation_id: str,
    tasks: Sequence[int],
    *,
    suite: Suite | None = None,
    base_url: str = NOWHERE,
    model: str = "m",
    **fields: Any,
) -> Evaluation:
    """An evaluation of ``tasks`` against ``model`` at ``base_url`` (nothing listens there by default), ten turns
    and 30 s cells at most; with ``suite``, the tasks the suite cannot run are its unavailable tasks. ``fields``
    are any other of the evaluation's fields (``max_concurrency``, ``judge``, ``has_api_key`` ...)."""
    values: dict[str, Any] = {
        "id": evaluation_id,
        "model": ModelEndpoint(base_url=base_url, model=model),
        "suite": "pybench",
        "tasks": list(tasks),
        "max_turns": 10,
        "cell_timeout_s": 30,
        "prompt": "gpt",
        "sampling": Sampling(),
    }
    if suite is not None:
        values["unavailable_tasks"] = [task for task in tasks if not suite.task(task).available]
    return Evaluation(**(values | fields))


def make_session_info(**fields: Any) -> SessionInfo:
    """Where a session ran: a Docker sandbox started now; ``fields`` replace any of it by name."""
    values: dict[str, Any] = {
        "sandbox_backend": "docker",
        "sandbox_id": "abc",
        "sandbox_name": "n",
        "image": "i",
        "started_at": datetime.now(UTC),
    }
    return SessionInfo(**(values | fields))


def make_trajectory(
    evaluation_id: str,
    task: int,
    answer: str | None = "Finished: saved",
    *,
    query: str | None = "q",
    attempt: int = 1,
    end_reason: EndReason = EndReason.NO_CODE,
    **fields: Any,
) -> Trajectory:
    """A finished session of ``task``: the user asked ``query`` and the model's last reply was ``answer`` (either
    left out when None). ``fields`` are any other of the trajectory's fields; ``messages`` replaces the two."""
    messages = [Message(role="user", content=query)] if query is not None else []
    if answer is not None:
        messages.append(Message(role="assistant", content=answer))
    values: dict[str, Any] = {
        "evaluation_id": evaluation_id,
        "task_index": task,
        "attempt": attempt,
        "messages": messages,
        "end_reason": end_reason,
    }
    return Trajectory(**(values | fields))


def make_judgment(passed: bool, **fields: Any) -> Judgment:
    """An absolute judgment that passed or failed the session; ``fields`` replace any of it by name."""
    values: dict[str, Any] = {
        "mode": JudgeMode.ABSOLUTE,
        "status": JudgmentStatus.PASSED if passed else JudgmentStatus.FAILED,
        "judge_model": "judge",
        "prompt_hash": "h",
    }
    return Judgment(**(values | fields))


def make_verdict(
    evaluation_id: str,
    task: int,
    status: VerdictStatus,
    *,
    attempt: int = 1,
    category: str = "Chart",
    **fields: Any,
) -> Verdict:
    """The verdict ``status`` on ``task``'s ``attempt``, in the paper's ``category``; ``fields`` are any other of
    the verdict's fields (``turns``, ``fixed``, ``judgment``, ``retryable`` ...)."""
    return Verdict(
        evaluation_id=evaluation_id,
        task_index=task,
        attempt=attempt,
        paper_category=category,
        status=status,
        **fields,
    )


def make_png(width: int = 120, height: int = 80, colour: tuple[int, int, int] = (59, 111, 182)) -> bytes:
    """A PNG image of ``width`` x ``height`` with a diagonal band of ``colour`` on white, made without any imaging
    library (one pixel: ``colour``)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    rows = b"".join(
        b"\x00"
        + b"".join(bytes(colour) if abs(x - y * width // height) < 12 else b"\xff\xff\xff" for x in range(width))
        for y in range(height)
    )
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
