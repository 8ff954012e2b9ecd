"""One task session: a fresh sandbox, the task's inputs in ``./data``, the agent loop, ``./output`` collected
(at most ``DEFAULT_MAX_TREE_FILES`` entries and ``DEFAULT_MAX_TREE_BYTES`` bytes of it, the first by name; the
trajectory's ``output_truncated`` says what was dropped, and the grading reads what was kept).

``run_task_session`` never raises for what the environment or the model does: a sandbox that does not
start or dies, or a model endpoint that fails, ends the session with an infrastructure ``EndReason`` and the
error in the trajectory. The sandbox is removed whatever happens.
"""

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from executor.agent import AgentRun, ChatModel, run_agent
from executor.messages import opening_messages
from executor.pool import WarmPool, WarmSandbox, discard, start_sandbox
from executor.settings import ExecutorSettings
from services.errors import SandboxError, SuiteError
from services.evaluation import Evaluation
from services.pybench.suite import Suite
from services.sandbox.base import SandboxBackend, Tree
from services.sandbox.contract import WORKSPACE, SandboxHandle
from services.state import DEFAULT_SECRET_TTL_S
from services.task import Task
from services.trajectory import EndReason, SessionInfo, Trajectory

log = logging.getLogger(__name__)

SessionResult = tuple[Trajectory, dict[str, bytes]]
"""A session's trajectory, and the files it left under ``./output`` keyed by path relative to it."""


def sampling_for(evaluation: Evaluation, suite: Suite) -> dict[str, Any]:
    """The sampling parameters of every request: the suite prompt's defaults, overridden per evaluation."""
    sampling: dict[str, Any] = dict(suite.prompt_config(evaluation.prompt).sampling)
    sampling.update(evaluation.sampling.model_dump(exclude_none=True))
    return sampling


def sandbox_path(suite_relative: str) -> str:
    """Map a suite-relative input name (``./data/x.csv``) to its place in the sandbox (``/workspace/data/x.csv``).

    Raises:
        SuiteError: the name is absolute or climbs out of the workspace.
    """
    parts = [p for p in suite_relative.split("/") if p not in ("", ".")]
    if suite_relative.startswith("/") or ".." in parts or not parts:
        raise SuiteError(f"input name {suite_relative!r} must be relative to the suite root, like ./data/x.csv")
    return WORKSPACE + "/" + "/".join(parts)


def copy_inputs(backend: SandboxBackend, handle: SandboxHandle, suite: Suite, task: Task) -> None:
    """Copy every input file of the task into the sandbox, at the path the task names.

    Raises:
        SuiteError: an input is missing from the suite or its name leaves the workspace.
        SandboxUnavailableError: the sandbox is gone.
    """
    for item in task.inputs:
        source = suite.input_file(item.path)
        try:
            data = source.read_bytes()
        except OSError as exc:
            raise SuiteError(f"cannot read input {item.path} of task {task.index}: {exc}") from exc
        backend.put_file(handle, sandbox_path(item.path), data)


def run_task_session(
    evaluation: Evaluation,
    task: Task,
    attempt: int,
    *,
    suite: Suite,
    backend: SandboxBackend,
    settings: ExecutorSettings,
    model: ChatModel,
    pool: WarmPool | None = None,
    cancelled: Callable[[], bool] | None = None,
    spent_usd: Callable[[], float | None] | None = None,
) -> SessionResult:
    """Run one task session in a sandbox of its own (image and limits from ``settings.sandbox_spec``): taken from
    ``pool`` when given (already started), else started now. ``cancelled`` and ``spent_usd`` (the evaluation's
    spend, for its cost limit) are asked before each turn (see ``executor.agent.run_agent``).

    Returns:
        The trajectory, and the files the session left under ``./output`` keyed by path relative to it.

    Raises:
        SuiteError: the suite has no prompt of the evaluation's name, or an input cannot be read.
    """
    started = time.monotonic()
    messages = opening_messages(suite.system_prompt(evaluation.prompt), task)
    spec = settings.sandbox_spec(evaluation.id, task.index, attempt)

    def finish(
        run: AgentRun, session: SessionInfo | None, files: dict[str, bytes], truncated: str | None = None
    ) -> SessionResult:
        trajectory = Trajectory(
            evaluation_id=evaluation.id,
            task_index=task.index,
            attempt=attempt,
            messages=run.messages,
            turns=run.turns,
            end_reason=run.end_reason,
            error=run.error,
            session=session,
            wall_s=time.monotonic() - started,
            output_files=sorted("./output/" + name for name in files),
            output_truncated=truncated,
        )
        return trajectory, files

    def infra_failure(error: SandboxError, session: SessionInfo | None) -> SessionResult:
        return finish(AgentRun(messages, end_reason=EndReason.SANDBOX_ERROR, error=str(error)), session, {})

    session_started = datetime.now(UTC)
    try:
        sandbox: WarmSandbox = pool.take(spec) if pool is not None else start_sandbox(backend, spec)
    except SandboxError as exc:
        log.warning("task %d: sandbox did not start: %s", task.index, exc)
        return infra_failure(exc, None)
    handle, kernel = sandbox.handle, sandbox.kernel
    session = SessionInfo(
        sandbox_backend=handle.backend,
        sandbox_id=handle.sandbox_id,
        sandbox_name=handle.name,
        image=handle.image,
        started_at=session_started,
        ready_s=time.monotonic() - started,
        warm=sandbox.warm,
    )
    try:
        try:
            copy_inputs(backend, handle, suite, task)
        except SandboxError as exc:
            return infra_failure(exc, session)
        run = run_agent(
            messages,
            model,
            kernel,
            max_turns=evaluation.max_turns,
            cell_timeout_s=evaluation.cell_timeout_s,
            sampling=sampling_for(evaluation, suite),
            tools=evaluation.mode == "tools",
            cancelled=cancelled,
            budgets=evaluation.budgets,
            spent_usd=spent_usd,
        )
        try:
            tree = backend.collect_tree(handle, f"{WORKSPACE}/output")
        except SandboxError as exc:
            log.warning("task %d: could not collect ./output: %s", task.index, exc)
            tree = Tree()
    finally:
        discard(backend, sandbox)
    session.ended_at = datetime.now(UTC)
    truncated = tree.note("./output")
    if truncated is not None:
        log.info("task %d: %s", task.index, truncated)
    return finish(run, session, tree.files, truncated)


KEY_LOST = (
    "the model API key of this evaluation is no longer held (Redis lost it, or it expired {days} days after "
    "submission), and the endpoint is never called without it: send it again with PUT "
    "/v1/evaluations/{evaluation_id}/keys, then POST /v1/evaluations/{evaluation_id}/retry"
)


def key_lost(evaluation: Evaluation, task: Task, attempt: int, suite: Suite) -> Trajectory:
    """The trajectory of a session not run because its model key is gone: the opening messages only, ended by
    ``key_lost`` with a message that says how to send the key again (graded ``infra_error``, never ``failed``,
    never retried by itself).

    Raises:
        SuiteError: the suite has no prompt of the evaluation's name.
    """
    return Trajectory(
        evaluation_id=evaluation.id,
        task_index=task.index,
        attempt=attempt,
        messages=opening_messages(suite.system_prompt(evaluation.prompt), task),
        end_reason=EndReason.KEY_LOST,
        error=KEY_LOST.format(days=DEFAULT_SECRET_TTL_S // 86400, evaluation_id=evaluation.id),
    )
