"""Asking an evaluation's LLM judge about one session, as the evaluation configured it.

The judge's key comes from the secret store (never from the job's arguments). In pairwise mode the reference
is the suite's recorded trajectory of the task (``trajectory.jsonl``); a task without a recording is shown to
the judge as "no trajectory", as PyBench does. A judge that fails or answers out of schema gives an
``error`` or ``unparseable`` outcome: it is counted, never dropped and never raised.
"""

from pathlib import Path

import httpx
from pydantic import SecretStr

from grader.judge import Judge, Judgment, load_reference, prompt_hash
from services.errors import SuiteError, TaskNotFoundError
from services.evaluation import JudgeConfig
from services.netguard import EgressPolicy, EgressRefusedError, pinned_transport
from services.task import Task
from services.trajectory import Trajectory
from services.verdict import JudgeOutcome

RECORDINGS = "trajectory.jsonl"
"""The suite file whose recorded trajectories are the pairwise references."""


def outcome_of(judgment: Judgment) -> JudgeOutcome:
    """The shared-contract form of a judgment (what a verdict keeps)."""
    return JudgeOutcome(
        mode=judgment.mode.value,
        status=judgment.status.value,
        reason=judgment.reason,
        judge_model=judgment.judge_model,
        prompt_hash=judgment.prompt_hash,
        preference=judgment.preference.value if judgment.preference else None,
        latency_s=judgment.latency_s,
        prompt_tokens=judgment.prompt_tokens,
        completion_tokens=judgment.completion_tokens,
    )


def judge_session(
    config: JudgeConfig,
    api_key: str | None,
    task: Task,
    trajectory: Trajectory,
    suite_root: Path,
    policy: EgressPolicy,
    **options: float,
) -> JudgeOutcome:
    """Judge one session under ``config``. ``options`` go to ``grader.judge.Judge`` (timeouts, backoff).

    Connections go only where ``policy`` permits, pinned to the address checked. Never raises for the
    endpoint's failures, a refused endpoint included (they come back as an ``error`` outcome).
    """
    try:
        return _judge(config, api_key, task, trajectory, suite_root, pinned_transport(policy), **options)
    except EgressRefusedError as exc:
        return _not_judged(config, f"judge endpoint refused: {exc}")


def judge_key_lost(config: JudgeConfig, evaluation_id: str) -> JudgeOutcome:
    """The ``error`` outcome of a session not judged because the judge's key is gone (the endpoint is never
    called without the key it was submitted with)."""
    return _not_judged(
        config,
        "the judge's API key is no longer held (Redis lost it, or it expired), and the judge is never called "
        f"without it: send it again with PUT /v1/evaluations/{evaluation_id}/keys (sessions graded from then "
        "on are judged)",
    )


def _not_judged(config: JudgeConfig, reason: str) -> JudgeOutcome:
    """The ``error`` outcome of a session the judge was never asked about, with why."""
    return JudgeOutcome(
        mode=config.mode,
        status="error",
        reason=reason,
        judge_model=config.endpoint.model,
        prompt_hash=prompt_hash(config.mode),
    )


def _judge(
    config: JudgeConfig,
    api_key: str | None,
    task: Task,
    trajectory: Trajectory,
    suite_root: Path,
    transport: httpx.BaseTransport,
    **options: float,
) -> JudgeOutcome:
    key = SecretStr(api_key) if api_key else None
    judge = Judge(config.endpoint.base_url, config.endpoint.model, api_key=key, transport=transport, **options)  # type: ignore[arg-type]
    with judge:
        if config.mode == "pairwise":
            try:
                reference = load_reference(suite_root / RECORDINGS, task.index).messages
            except (SuiteError, TaskNotFoundError):
                reference = []
            return outcome_of(judge.judge_pairwise(task.query, trajectory.messages, reference))
        return outcome_of(judge.judge_absolute(task.query, trajectory.messages))
