"""Asking an evaluation's LLM judge about one session, as the evaluation configured it: the entry the grader
job calls.

The judge's key comes from the secret store (never from the job's arguments). In pairwise mode the reference
is the suite's recorded trajectory of the task (``trajectory.jsonl``, read by ``services.pybench.recordings``); a task
without a recording, or a file that cannot be read, is shown to the judge as "no trajectory", as PyBench does.
A judge that fails, answers out of schema or sits behind a refused URL gives an ``error`` or ``unparseable``
judgment: it is counted, never dropped and never raised.
"""

from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from grader.judge.client import Judge
from grader.judge.prompts import prompt_hash
from services.endpoint.netguard import EgressPolicy, pinned_transport
from services.errors import SuiteError
from services.evaluation import JudgeConfig
from services.pybench.recordings import recording_of
from services.task import Task
from services.trajectory import Trajectory
from services.verdict import JudgeMode, Judgment, JudgmentStatus

RECORDINGS = "trajectory.jsonl"
"""The suite file whose recorded trajectories are the pairwise references."""


def judge_session(
    config: JudgeConfig,
    api_key: str | None,
    task: Task,
    trajectory: Trajectory,
    suite_root: Path,
    policy: EgressPolicy,
    **options: float,
) -> Judgment:
    """Judge one session under ``config``. ``options`` go to ``grader.judge.Judge`` (timeouts, retries, backoff).

    Connections go only where ``policy`` permits, pinned to the address checked. Never raises for the
    endpoint's failures, a refused endpoint included (they come back as an ``error`` judgment).
    """
    key = SecretStr(api_key) if api_key else None
    transport = pinned_transport(policy)
    judge = Judge(config.endpoint.base_url, config.endpoint.model, api_key=key, transport=transport, **options)  # type: ignore[arg-type]
    with judge:
        if config.mode == "pairwise":
            try:
                reference = recording_of(suite_root / RECORDINGS, task.index).messages
            except SuiteError:  # TaskNotFoundError included: the task has no recording
                reference = []
            return judge.judge_pairwise(task.query, trajectory.messages, reference)
        return judge.judge_absolute(task.query, trajectory.messages)


def judge_key_lost(config: JudgeConfig, evaluation_id: str) -> Judgment:
    """The ``error`` judgment of a session not judged because the judge's key is gone (the endpoint is never
    called without the key it was submitted with)."""
    return Judgment(
        mode=JudgeMode(config.mode),
        status=JudgmentStatus.ERROR,
        reason="the judge's API key is no longer held (Redis lost it, or it expired), and the judge is never "
        f"called without it: send it again with PUT /v1/evaluations/{evaluation_id}/keys (sessions graded from "
        "then on are judged)",
        judge_model=config.endpoint.model,
        prompt_hash=prompt_hash(config.mode),
        judged_at=datetime.now(UTC),
    )
